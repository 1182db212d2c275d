"""The approval webhook over a real workflow store: who decides comes from the token, once."""

from __future__ import annotations

import json
import logging
import os
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import psycopg
import pytest
from fastapi.testclient import TestClient
from sqlalchemy.engine import make_url

from statekeep.errors import ConfigError, InvalidInputError
from statekeep.workflow import Engine, Registry, RunStatus, SQLWorkflowStore
from tests.workflow.conftest import EngineFactory, lines
from tests.workflow.test_approvals import refund_registry as approvals_registry

ROOT = Path(__file__).resolve().parents[2]
ALICE, BOB = "alice-token-0123456789", "bob-token-0123456789ab"
TOKENS = {"alice@example.com": ALICE, "bob@example.com": BOB}


def refund_registry(effects: Path, expires: float | None = None) -> Registry:
    """The approvals tests' gated refund, of 120."""
    amount = effects.with_name("amount")
    amount.write_text("120")
    return approvals_registry(effects, amount, expires)


@pytest.fixture
def setup(make_engine: EngineFactory, tmp_path: Path) -> Iterator[tuple[Engine, TestClient, Path]]:
    """An engine with one run waiting for approval, and a client of the webhook over its store."""
    from statekeep.web import create_app

    effects = tmp_path / "effects"
    engine = make_engine(refund_registry(effects))
    assert engine.run(engine.registry.get("refund", 1), "r", "o-1").status is RunStatus.WAITING_FOR_APPROVAL
    with TestClient(create_app(engine.store, tokens=TOKENS)) as client:
        yield engine, client, effects


def auth(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


def test_a_decision_over_http_is_recorded_once_as_the_token_holder(
    setup: tuple[Engine, TestClient, Path],
) -> None:
    """The pending approval is listed; approving wakes the run, which then acts once; a repeat is 409."""
    engine, client, effects = setup
    listed = client.get("/approvals", headers=auth(BOB))
    assert listed.status_code == 200
    (ask,) = listed.json()
    assert (ask["run_id"], ask["action"], ask["args"], ask["status"]) == (
        "r",
        "refund",
        {"args": ["o-1", 120], "kwargs": {}},
        "pending",
    )
    decided = client.post(
        f"/approvals/{ask['approval_id']}/decision",
        json={"approve": True, "comment": "ok"},
        headers=auth(BOB),
    )
    assert decided.status_code == 200, decided.text
    assert (decided.json()["status"], decided.json()["decided_by"]) == ("approved", "bob@example.com")
    assert client.get("/runs/r", headers=auth(ALICE)).json()["status"] == "pending"  # runnable again
    assert engine.resume("r").status is RunStatus.COMPLETED
    assert lines(effects) == ["r/2/0 o-1 120"]

    again = client.post(
        f"/approvals/{ask['approval_id']}/decision", json={"approve": False}, headers=auth(ALICE)
    )
    assert again.status_code == 409
    assert again.json()["error"] == "ApprovalDecidedError"
    assert engine.store.approval(ask["approval_id"]).decided_by == "bob@example.com"
    assert client.get("/approvals", headers=auth(ALICE)).json() == []
    assert [a["status"] for a in client.get("/approvals?status=all", headers=auth(ALICE)).json()] == [
        "approved"
    ]
    assert lines(effects) == ["r/2/0 o-1 120"]


def test_a_rejection_over_http_means_the_action_never_runs(setup: tuple[Engine, TestClient, Path]) -> None:
    """Rejected by the token holder: the run fails saying who rejected it, and the tool never ran."""
    engine, client, effects = setup
    (ask,) = engine.store.approvals()
    response = client.post(
        f"/approvals/{ask.approval_id}/decision",
        json={"approve": False, "comment": "fraud"},
        headers=auth(ALICE),
    )
    assert response.status_code == 200
    run = engine.resume("r")
    assert run.status is RunStatus.FAILED
    assert run.error is not None
    assert "rejected by alice@example.com: fraud" in run.error
    assert lines(effects) == []


def test_without_a_valid_token_nothing_is_shown_or_decided(setup: tuple[Engine, TestClient, Path]) -> None:
    """No token, a wrong one, another scheme: 401 on every route but /health; nothing is decided."""
    engine, client, _ = setup
    (ask,) = engine.store.approvals()
    decision = f"/approvals/{ask.approval_id}/decision"
    for headers in (
        {},
        auth("alice-token-0123456780"),
        auth(ALICE[:-1]),
        {"Authorization": f"Basic {ALICE}"},
    ):
        for method, path in (("GET", "/approvals"), ("GET", "/runs/r"), ("POST", decision)):
            response = client.request(method, path, headers=headers, json={"approve": True})
            assert response.status_code == 401, (headers, path)
            assert response.headers["www-authenticate"] == "Bearer"
            assert response.json()["error"] == "Unauthorized"
        broken = client.post(decision, content=b"{not json", headers=headers)
        assert broken.status_code == 401  # a stranger's bad body is not even read
    for path in ("/docs", "/redoc", "/openapi.json"):  # a stranger cannot even tell what is documented
        assert client.get(path).status_code == 401
    assert client.get("/docs", headers=auth(ALICE)).status_code == 200
    assert client.get("/openapi.json", headers=auth(ALICE)).json()["paths"]
    assert client.get("/redoc", headers=auth(ALICE)).status_code == 404
    assert client.get("/health").json() == {"ok": True}
    assert engine.store.approval(ask.approval_id).status == "pending"


def test_the_decider_cannot_be_named_in_the_body_and_bad_input_is_422(
    setup: tuple[Engine, TestClient, Path],
) -> None:
    """A body naming `by`, a non-bool approve, a NUL comment or id: 422, and nothing is decided."""
    engine, client, _ = setup
    (ask,) = engine.store.approvals()
    decision = f"/approvals/{ask.approval_id}/decision"
    for body in (
        {"approve": True, "by": "mallory"},
        {"approve": "maybe"},
        {"approve": "yes"},
        {"approve": "true"},
        {"approve": 1},
        {},
        {"approve": True, "comment": "ok\x00"},
        {"approve": True, "result": float("inf")},
    ):
        response = client.post(decision, content=json.dumps(body), headers=auth(ALICE))
        assert response.status_code == 422, (body, response.text)
        assert response.json()["error"] == "InvalidInputError", response.text
    broken = client.post(decision, content=b"{not json", headers=auth(ALICE))
    assert (broken.status_code, broken.json()["error"]) == (422, "InvalidInputError")
    assert client.get("/approvals/a%00b", headers=auth(ALICE)).status_code == 422
    assert client.get("/approvals?status=maybe", headers=auth(ALICE)).status_code == 422
    assert engine.store.approval(ask.approval_id).status == "pending"


def test_unknown_ids_are_404_and_an_expired_approval_is_410(
    make_engine: EngineFactory, tmp_path: Path
) -> None:
    """404 names what is missing; a decision after expiry is 410, however the expiry was recorded."""
    from statekeep.web import create_app

    engine = make_engine(refund_registry(tmp_path / "effects", expires=0.2))
    engine.run(engine.registry.get("refund", 1), "r", "o-1")
    (ask,) = engine.store.approvals()
    time.sleep(0.3)
    with TestClient(create_app(engine.store, tokens=TOKENS)) as client:
        assert client.get("/approvals/nope", headers=auth(ALICE)).json()["error"] == "ApprovalNotFoundError"
        assert client.get("/runs/ghost", headers=auth(ALICE)).status_code == 404
        decision = f"/approvals/{ask.approval_id}/decision"
        for _ in range(2):  # the first records the expiry, the second finds it: 410 both times
            late = client.post(decision, json={"approve": True}, headers=auth(ALICE))
            assert (late.status_code, late.json()["error"]) == (410, "ApprovalExpiredError")
        engine.run(engine.registry.get("refund", 1), "r2", "o-2")
        (ask2,) = engine.store.approvals()
        time.sleep(0.3)
        assert engine.resume("r2").status is RunStatus.FAILED  # the worker side records the expiry
        decision2 = f"/approvals/{ask2.approval_id}/decision"
        assert client.post(decision2, json={"approve": True}, headers=auth(ALICE)).status_code == 410
    assert engine.store.approval(ask.approval_id).status == "expired"
    assert lines(tmp_path / "effects") == []


@pytest.mark.parametrize(
    ("tokens", "message"),
    [
        ({}, "at least one"),
        ({"": ALICE}, "identity"),
        ({"alice": "short"}, "at least 16"),
        ({"alice": 12345678901234567}, "at least 16"),
        ({"alice": ALICE, "bob": ALICE}, "share a token"),
        ({"alice": "jeton-secret-à-moi-0123"}, "printable ASCII"),
        ({"alice": "token with spaces 0123"}, "printable ASCII"),
        ({"al\x00ice": ALICE}, "NUL"),
        ({"a" * 256: ALICE}, "at most 255"),
    ],
)
def test_bad_token_settings_are_refused(sqlite_url: str, tokens: Any, message: str) -> None:
    """An app that would accept anyone, or not know who decided, is never built."""
    from statekeep.web import create_app

    store = SQLWorkflowStore(sqlite_url)
    with pytest.raises(ConfigError, match=message):
        create_app(store, tokens=tokens)
    with pytest.raises(InvalidInputError, match="store"):
        create_app("sqlite://", tokens=TOKENS)  # type: ignore[arg-type]
    store.db.dispose()


def cli_env(tmp_path: Path, database_url: str, **extra: str) -> dict[str, str]:
    """The environment of a `statekeep` child process over ``database_url``."""
    return {
        **os.environ,
        "PYTHONPATH": str(ROOT / "src"),
        "STATEKEEP_HOME": str(tmp_path / "home"),
        "STATEKEEP_DATABASE_URL": database_url,
        **extra,
    }


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_statekeep_serve_decides_over_real_http(database_url: str, tmp_path: Path) -> None:
    """The command serves the webhook from settings; an approval decided over TCP lets a worker finish."""
    effects = tmp_path / "effects"
    engine = Engine(database_url, refund_registry(effects))
    engine.run(engine.registry.get("refund", 1), "r", "o-1")
    tokens = tmp_path / "tokens.json"
    tokens.write_text(json.dumps(TOKENS))
    port, log = _free_port(), tmp_path / "server.log"
    with log.open("w") as out:  # the child has its own copy of the file; ours closes here
        server = subprocess.Popen(
            [sys.executable, "-m", "statekeep", "serve", "--port", str(port)],
            env=cli_env(tmp_path, database_url, STATEKEEP_WEB_TOKENS_FILE=str(tokens)),
            cwd=tmp_path,
            stdout=out,
            stderr=subprocess.STDOUT,
        )
    try:
        base = f"http://127.0.0.1:{port}"
        deadline = time.monotonic() + 60
        while True:
            try:
                if httpx.get(f"{base}/health").status_code == 200:
                    break
            except httpx.TransportError:
                pass
            assert server.poll() is None, log.read_text()
            assert time.monotonic() < deadline, "the server did not start"
            time.sleep(0.1)
        (ask,) = httpx.get(f"{base}/approvals", headers=auth(ALICE)).json()
        decided = httpx.post(
            f"{base}/approvals/{ask['approval_id']}/decision", json={"approve": True}, headers=auth(ALICE)
        )
        assert decided.json()["decided_by"] == "alice@example.com"
    finally:
        server.terminate()
        server.wait(timeout=30)
    assert engine.resume("r").status is RunStatus.COMPLETED
    assert lines(effects) == ["r/2/0 o-1 120"]
    engine.store.close()


def test_statekeep_serve_refuses_a_bad_tokens_file_in_one_line(sqlite_url: str, tmp_path: Path) -> None:
    """A missing, non-JSON, deep or non-object tokens file, a bad scope, a zero body limit: one line."""
    cases = {
        "missing.json": None,
        "bad.json": "{not json",
        "list.json": '["a"]',
        "weak.json": '{"a": "b"}',
        "deep.json": "[" * 100_000 + "]" * 100_000,
        "scope.json": json.dumps({"a": {"token": ALICE, "gates": []}}),
        "typo.json": json.dumps({"a": {"token": ALICE, "gate": ["refund"]}}),
    }
    for name, text in cases.items():
        path = tmp_path / name
        if text is not None:
            path.write_text(text)
        out = subprocess.run(
            [sys.executable, "-m", "statekeep", "serve", "--tokens-file", str(path)],
            env=cli_env(tmp_path, sqlite_url),
            cwd=tmp_path,
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert out.returncode == 1, (name, out.stderr)
        assert out.stderr.startswith("error: "), (name, out.stderr)
        assert len(out.stderr.strip().splitlines()) == 1, (name, out.stderr)
    good = tmp_path / "good.json"
    good.write_text(json.dumps(TOKENS))
    out = subprocess.run(  # a body limit of 0 would refuse every decision
        [sys.executable, "-m", "statekeep", "serve", "--tokens-file", str(good)],
        env=cli_env(tmp_path, sqlite_url, STATEKEEP_WEB_MAX_BODY="0"),
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert (out.returncode, out.stderr.count("\n")) == (1, 1), out.stderr
    assert "max_body" in out.stderr


def test_a_database_failure_is_503_and_the_answer_names_no_database(
    postgres_url: str, postgres_admin_url: str, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """The database vanishes under the app: 503 with a fixed text; the details, redacted, go to the log."""
    from statekeep.web import create_app

    store = SQLWorkflowStore(postgres_url)
    name = str(make_url(postgres_url).database)
    with TestClient(create_app(store, tokens=TOKENS)) as client:
        assert client.get("/approvals", headers=auth(ALICE)).json() == []
        with psycopg.connect(postgres_admin_url, autocommit=True) as admin:
            admin.execute(f'DROP DATABASE "{name}" WITH (FORCE)')
        with caplog.at_level(logging.ERROR, logger="statekeep.web"):
            failed = client.get("/approvals", headers=auth(ALICE))
    assert (failed.status_code, failed.json()["error"]) == (503, "StorageError")
    assert name not in failed.text
    assert "server log" in failed.json()["detail"]
    assert name in caplog.text  # the operator learns which database failed
    store.db.dispose()


def test_passwords_in_database_urls_never_reach_a_message() -> None:
    """In the user part or in the query (password=, sslpassword=), a URL's secret prints as ***."""
    from statekeep.db import Database

    url = (
        "postgresql+psycopg://svc:hunter2@127.0.0.1:1/prod?connect_timeout=1&password=S3CRET&sslpassword=k3y"
    )
    shown = repr(Database(url))
    assert "hunter2" not in shown
    assert "S3CRET" not in shown
    assert "k3y" not in shown
    assert "svc:***@127.0.0.1:1/prod" in shown
    with pytest.raises(ConfigError) as failed:
        Database(url).check()
    assert "S3CRET" not in str(failed.value)
    assert "hunter2" not in str(failed.value)


def test_a_decision_over_http_with_keys_stays_readable_by_a_keyless_worker(
    make_engine: EngineFactory, database_url: str, tmp_path: Path
) -> None:
    """The console's store has keys, the run's engine none: the decision is plain, the run completes."""
    from statekeep.keys import KeyRing, LocalKeyFile
    from statekeep.web import create_app
    from tests.workflow.test_sealed_runs import ship_registry

    effects = tmp_path / "effects"
    engine = make_engine(ship_registry(effects))
    assert engine.run(engine.registry.get("order", 1), "o-1", "ada").status is RunStatus.WAITING_FOR_APPROVAL
    store = SQLWorkflowStore(database_url, keys=KeyRing(database_url, LocalKeyFile(tmp_path / "keys.json")))
    with TestClient(create_app(store, tokens=TOKENS)) as client:
        (ask,) = client.get("/approvals", headers=auth(ALICE)).json()
        body = {"approve": True, "comment": "paid"}
        decided = client.post(f"/approvals/{ask['approval_id']}/decision", json=body, headers=auth(ALICE))
        assert decided.status_code == 200, decided.text
    run = engine.resume("o-1")
    assert (run.status, run.output, run.error) == (RunStatus.COMPLETED, {"shipped": 1234}, None)
    assert engine.store.approval(ask["approval_id"]).comment == "paid"
    assert lines(effects) == ["o-1/2/0 ada 1234"]
    store.close()


def test_approvals_come_a_page_at_a_time_with_a_link_to_the_next(
    make_engine: EngineFactory, tmp_path: Path
) -> None:
    """``limit`` and ``after``: every approval once, oldest first; a full page links to the next."""
    from statekeep.web import create_app

    engine = make_engine(refund_registry(tmp_path / "effects"))
    for i in range(5):
        engine.run(engine.registry.get("refund", 1), f"r{i}", f"o-{i}")
    every = [a.approval_id for a in engine.store.approvals(status=None)]
    with TestClient(create_app(engine.store, tokens=TOKENS)) as client:
        seen, sizes = [], []
        url: str | None = "/api/approvals?status=all&limit=2"
        while url is not None:
            page = client.get(url, headers=auth(BOB))
            assert page.status_code == 200, page.text
            seen += [a["approval_id"] for a in page.json()]
            sizes.append(len(page.json()))
            link = page.headers.get("link")
            url = None if link is None else link.split(">")[0].lstrip("<")
        assert sizes == [2, 2, 1]
        assert seen == every
        assert len(client.get("/api/approvals?status=all", headers=auth(BOB)).json()) == 5  # 100 a page
        assert (
            client.get(f"/api/approvals?after={every[0]}", headers=auth(BOB)).json()[0]["approval_id"]
            == every[1]
        )
        assert client.get("/api/approvals?after=nope", headers=auth(BOB)).status_code == 404
        for bad in ("limit=0", "limit=1001", "limit=x"):
            assert client.get(f"/api/approvals?{bad}", headers=auth(BOB)).status_code == 422, bad


def test_a_scoped_token_gets_full_pages_of_its_own_approvals(
    make_engine: EngineFactory, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Approvals outside the token's gates are skipped, and the page is filled from further on."""
    from statekeep.web import api, create_app

    monkeypatch.setattr(api, "SCOPED_BATCH", 1)  # read the store a page of 2 at a time: the loop reads on

    registry = Registry()
    for name in ("refund", "wire"):
        tool = registry.tool(name)(lambda key, order: order)
        gated = tool.requiring_approval(f"{name}s need a person")

        def flow(ctx: Any, order: str, gated: Any = gated) -> Any:
            return ctx.call_tool(gated, order)

        registry.workflow(name, version=1)(flow)
    engine = make_engine(registry)
    for i in range(6):  # refund, wire, refund, wire...
        name = ("refund", "wire")[i % 2]
        engine.run(engine.registry.get(name, 1), f"r{i}", f"o-{i}")
    wires = [a.approval_id for a in engine.store.approvals(action="wire")]
    tokens: dict[str, Any] = {
        **TOKENS,
        "carol@example.com": {"token": "carol-token-0123456789", "gates": ["wire"]},
    }
    with TestClient(create_app(engine.store, tokens=tokens)) as client:
        carol = auth("carol-token-0123456789")
        first = client.get("/api/approvals?limit=2", headers=carol)
        assert [a["approval_id"] for a in first.json()] == wires[:2]
        assert first.headers["link"].startswith(f"</api/approvals?limit=2&after={wires[1]}>")
        rest = client.get(first.headers["link"].split(">")[0].lstrip("<"), headers=carol)
        assert [a["approval_id"] for a in rest.json()] == wires[2:]
        assert "link" not in rest.headers
