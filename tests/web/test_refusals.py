"""What the webhook must refuse, found by a hostile probe; each on SQLite and on PostgreSQL.

A lone surrogate in a decision's result answered 500 *after* the decision was
recorded, and from then on ``GET /approvals`` failed for everyone; one in a gated
call's arguments broke the listing the same way. JSON nested deep enough raised
a bare RecursionError. Requests without a token got 404, 405 or 400 instead of
401, and a body of any size was read. Each is refused now with
``{"error", "detail"}`` and nothing written; tokens may be limited to some gates
or owners, and a decision outside that scope is a 403.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient

from statekeep._check import MAX_DEPTH
from statekeep.config import Settings
from statekeep.errors import ConfigError, InvalidInputError
from statekeep.runtime import Runtime
from statekeep.workflow import Engine, Registry, RunContext, RunStatus, SQLWorkflowStore
from statekeep.workflow.tables import approvals
from tests.runtime import agent_app
from tests.web.test_webhook import ALICE, BOB, TOKENS, auth, refund_registry
from tests.workflow.conftest import EngineFactory, lines

CAROL, DAVE, ERIN = "carol-token-0123456789", "dave-token-0123456789a", "erin-token-0123456789ab"


@pytest.fixture
def setup(make_engine: EngineFactory, tmp_path: Path) -> Iterator[tuple[Engine, TestClient, str]]:
    """A refund waiting for approval, and a client of the webhook; yields the approval's id."""
    from statekeep.web import create_app

    engine = make_engine(refund_registry(tmp_path / "effects"))
    engine.run(engine.registry.get("refund", 1), "r", "o-1")
    (ask,) = engine.store.approvals()
    with TestClient(create_app(engine.store, tokens=TOKENS)) as client:
        yield engine, client, ask.approval_id


def nested(levels: int) -> str:
    return "[" * levels + "1" + "]" * levels


# --- 6a: lone surrogates ----------------------------------------------------------------------


def test_a_lone_surrogate_in_a_result_is_422_and_nothing_is_decided(
    setup: tuple[Engine, TestClient, str],
) -> None:
    """The decision is refused before it is recorded; the listing keeps working for everyone."""
    engine, client, approval_id = setup
    for body in (
        b'{"approve": false, "result": "\\ud800"}',
        b'{"approve": false, "result": {"\\udfff": 1}}',
        b'{"approve": false, "result": ["ok", "acct-\\udc00"]}',
        b'{"approve": true, "comment": "fine \\ud83d"}',
    ):
        response = client.post(f"/approvals/{approval_id}/decision", content=body, headers=auth(ALICE))
        assert response.status_code == 422, (body, response.text)
        assert response.json()["error"] == "InvalidInputError"
        assert "surrogate" in response.json()["detail"]
    assert engine.store.approval(approval_id).status == "pending"
    listed = client.get("/approvals", headers=auth(BOB))
    assert listed.status_code == 200
    assert [a["approval_id"] for a in listed.json()] == [approval_id]
    ok = client.post(
        f"/approvals/{approval_id}/decision",
        json={"approve": True, "comment": "\U0001f44d valid pair"},
        headers=auth(ALICE),
    )
    assert (ok.status_code, ok.json()["comment"]) == (200, "\U0001f44d valid pair")


def test_a_lone_surrogate_in_a_gated_calls_arguments_never_reaches_the_queue(
    make_engine: EngineFactory,
) -> None:
    """The call is refused in the run (held, for its code to be fixed); no approval is opened."""
    from statekeep.web import create_app

    registry = Registry()

    @registry.tool("pay")
    def pay(key: str, account: str) -> str:
        raise AssertionError("never called")

    @registry.workflow("pay", version=1)
    def flow(ctx: RunContext) -> Any:
        return ctx.call_tool(pay.requiring_approval("check"), "acct-\ud800")

    engine = make_engine(registry)
    with pytest.raises(InvalidInputError, match="surrogate"):
        engine.run(flow, "p")
    assert engine.store.approvals(status=None) == []
    with TestClient(create_app(engine.store, tokens=TOKENS)) as client:
        assert client.get("/approvals?status=all", headers=auth(ALICE)).json() == []


def test_text_stored_before_the_check_cannot_break_the_listing(
    setup: tuple[Engine, TestClient, str],
) -> None:
    """An approval whose arguments hold a lone surrogate (written before this release): still listed."""
    engine, client, approval_id = setup
    assert isinstance(engine.store, SQLWorkflowStore)
    with engine.store.db.begin() as conn:
        conn.execute(approvals.update().values(args='{"args":["acct-\\ud800"],"kwargs":{}}'))
    for path in ("/approvals", f"/approvals/{approval_id}"):
        response = client.get(path, headers=auth(ALICE))
        assert response.status_code == 200, response.text
        assert "acct-\\ud800" in response.text  # shown escaped, as it is stored
    assert json.loads(response.text)["args"]["args"] == ["acct-\ud800"]


# --- 6b: nesting ------------------------------------------------------------------------------


@pytest.mark.parametrize("levels", [MAX_DEPTH + 1, 30_000])
def test_deep_json_in_a_decision_is_422_and_nothing_is_decided(
    setup: tuple[Engine, TestClient, str], levels: int
) -> None:
    """Past the limit, however deep: 422 naming the nesting, never a RecursionError or a 500."""
    engine, client, approval_id = setup
    body = f'{{"approve": false, "result": {nested(levels)}}}'
    response = client.post(f"/approvals/{approval_id}/decision", content=body, headers=auth(ALICE))
    assert response.status_code == 422, response.text[:300]
    assert response.json()["error"] == "InvalidInputError"
    assert "levels deep" in response.json()["detail"]
    assert engine.store.approval(approval_id).status == "pending"
    fine = f'{{"approve": false, "result": {nested(MAX_DEPTH)}}}'
    assert client.post(f"/approvals/{approval_id}/decision", content=fine, headers=auth(ALICE)).is_success


# --- 6c: 401 before anything else -----------------------------------------------------------


def test_without_a_token_every_request_is_401_even_where_no_route_matches(
    setup: tuple[Engine, TestClient, str],
) -> None:
    """Unknown paths, wrong methods, broken or huge bodies: 401 first; 404/405/413 only with a token."""
    engine, client, approval_id = setup
    decision = f"/approvals/{approval_id}/decision"
    cases = [
        ("GET", "/nope", None, 404),
        ("GET", "/api/nope", None, 404),
        ("POST", "/approvals", None, 405),
        ("DELETE", f"/approvals/{approval_id}", None, 405),
        ("POST", decision, b"{not json", 422),
        ("POST", decision, b"", 422),
        ("POST", decision, nested(30_000).encode(), 422),
        ("POST", decision, b"x" * 100_000, 413),
    ]
    for method, path, body, with_token in cases:
        for headers in ({}, auth("not-a-token-at-all-000"), {"Authorization": f"Basic {ALICE}"}):
            response = client.request(method, path, content=body, headers=headers)
            assert response.status_code == 401, (method, path, headers, response.status_code)
            assert response.headers["www-authenticate"] == "Bearer"
            assert response.json() == {"error": "Unauthorized", "detail": "a valid bearer token is required"}
        response = client.request(method, path, content=body, headers=auth(ALICE))
        assert response.status_code == with_token, (method, path, response.text[:200])
        assert set(response.json()) == {"error", "detail"}
    for path in ("/docs", "/openapi.json", "/api/runs", "/runs"):  # the documentation and the console
        assert client.get(path).status_code == 401
        assert client.get(path, headers=auth(ALICE)).status_code == 200
    assert client.get("/health").json() == {"ok": True}
    assert engine.store.approval(approval_id).status == "pending"


def test_mounted_in_another_app_the_guard_still_knows_health(setup: tuple[Engine, TestClient, str]) -> None:
    """Under a prefix, /health stays open and everything else still needs the token."""
    from fastapi import FastAPI

    from statekeep.web import create_app

    engine, _, _ = setup
    outer = FastAPI()
    outer.mount("/hooks", create_app(engine.store, tokens=TOKENS))
    with TestClient(outer) as client:
        assert client.get("/hooks/health").json() == {"ok": True}
        assert client.get("/hooks/approvals").status_code == 401
        assert len(client.get("/hooks/approvals", headers=auth(ALICE)).json()) == 1


# --- 6d: body size ----------------------------------------------------------------------------


def test_a_body_over_the_limit_is_413_before_it_is_read(make_engine: EngineFactory, tmp_path: Path) -> None:
    """Declared too long, or streamed past the limit without a length: 413, nothing decided."""
    from statekeep.web import DEFAULT_MAX_BODY, create_app

    assert DEFAULT_MAX_BODY == 64 * 1024
    engine = make_engine(refund_registry(tmp_path / "effects"))
    engine.run(engine.registry.get("refund", 1), "r", "o-1")
    (ask,) = engine.store.approvals()
    decision = f"/approvals/{ask.approval_id}/decision"
    padded = json.dumps({"approve": True, "comment": "x" * 5_000}).encode()
    with TestClient(create_app(engine.store, tokens=TOKENS, max_body=4096)) as client:
        response = client.post(decision, content=padded, headers=auth(ALICE))
        assert response.status_code == 413
        assert response.json()["error"] == "Content Too Large"
        assert "4096" in response.json()["detail"]

        def chunks() -> Iterator[bytes]:  # no Content-Length: the server counts what it reads
            for i in range(0, len(padded), 1000):
                yield padded[i : i + 1000]

        streamed = client.post(decision, content=chunks(), headers=auth(ALICE))
        assert streamed.status_code == 413, streamed.text
        assert "content-length" not in streamed.request.headers
        assert engine.store.approval(ask.approval_id).status == "pending"
        small = client.post(decision, json={"approve": True, "comment": "ok"}, headers=auth(ALICE))
        assert small.status_code == 200
    with TestClient(create_app(engine.store, tokens=TOKENS)) as client:
        big = client.request("GET", "/approvals", content=b" " * (DEFAULT_MAX_BODY + 1), headers=auth(ALICE))
        assert big.status_code == 413
    for bad in (0, -1, True, 1.5, "64k"):
        with pytest.raises(ConfigError, match="max_body"):
            create_app(engine.store, tokens=TOKENS, max_body=bad)  # type: ignore[arg-type]


# --- 6e: scoped tokens ------------------------------------------------------------------------


def test_a_token_limited_to_some_gates_sees_and_decides_only_those(
    setup: tuple[Engine, TestClient, str],
) -> None:
    """Out of scope: absent from the listing, 403 to read or decide, and nothing is decided."""
    from statekeep.web import create_app

    engine, _, approval_id = setup
    tokens: dict[str, Any] = {
        **TOKENS,
        "carol@example.com": {"token": CAROL, "gates": ["wire-transfer"]},
        "dave@example.com": {"token": DAVE, "gates": ["refund", "wire-transfer"]},
    }
    with TestClient(create_app(engine.store, tokens=tokens)) as client:
        assert client.get("/approvals", headers=auth(CAROL)).json() == []
        assert client.get("/approvals?action=refund", headers=auth(CAROL)).json() == []
        for method, path in (
            ("GET", f"/approvals/{approval_id}"),
            ("POST", f"/approvals/{approval_id}/decision"),
            ("GET", "/runs/r"),
        ):
            response = client.request(method, path, json={"approve": True}, headers=auth(CAROL))
            assert response.status_code == 403, (path, response.text)
            assert response.json()["error"] == "Forbidden"
            assert "scope" in response.json()["detail"]
        assert engine.store.approval(approval_id).status == "pending"
        assert client.get("/approvals/nope", headers=auth(CAROL)).status_code == 404
        listed = client.get("/approvals", headers=auth(DAVE)).json()
        assert [a["approval_id"] for a in listed] == [approval_id]
        assert client.get("/runs/r", headers=auth(DAVE)).status_code == 200
        decided = client.post(
            f"/approvals/{approval_id}/decision", json={"approve": True}, headers=auth(DAVE)
        )
        assert (decided.status_code, decided.json()["decided_by"]) == (200, "dave@example.com")
        assert len(client.get("/approvals?status=all", headers=auth(ALICE)).json()) == 1  # unscoped


@pytest.fixture
def agent_runtime(settings: Settings) -> Iterator[Runtime]:
    rt = agent_app.build_runtime(settings)
    yield rt
    rt.close()


def test_a_token_limited_to_some_owners_decides_only_their_agents_runs(
    agent_runtime: Runtime, tmp_path: Path
) -> None:
    """The owner is the one a Runtime agent run was started for; other runs have none (fail closed)."""
    from statekeep.web import create_app

    rt = agent_runtime
    rt.run(agent_app.AGENT, "trip-1", owner=agent_app.OWNER, task="Plan a trip")
    (ask,) = rt.engine.store.approvals(run_id="trip-1")
    assert isinstance(rt.engine.store, SQLWorkflowStore)
    plain = Engine(rt.engine.store.db, refund_registry(tmp_path / "effects"))
    plain.run(plain.registry.get("refund", 1), "refund-1", "o-1")
    (plain_ask,) = plain.store.approvals(run_id="refund-1")
    tokens: dict[str, Any] = {
        "carol@example.com": {"token": CAROL, "owners": ["someone-else"]},
        "dave@example.com": {"token": DAVE, "owners": [agent_app.OWNER]},
        "erin@example.com": {"token": ERIN, "owners": [agent_app.OWNER], "gates": ["refund"]},
    }
    with TestClient(create_app(rt.engine.store, tokens=tokens)) as client:
        assert client.get("/approvals", headers=auth(CAROL)).json() == []
        assert client.get("/approvals", headers=auth(ERIN)).json() == []  # the owner's, but not that gate
        assert [a["approval_id"] for a in client.get("/approvals", headers=auth(DAVE)).json()] == [
            ask.approval_id
        ]
        for token in (CAROL, ERIN):
            refused = client.post(
                f"/approvals/{ask.approval_id}/decision", json={"approve": True}, headers=auth(token)
            )
            assert refused.status_code == 403, refused.text
        for token in (CAROL, DAVE, ERIN):  # a run without an owner is outside every owner scope
            refused = client.post(
                f"/approvals/{plain_ask.approval_id}/decision", json={"approve": True}, headers=auth(token)
            )
            assert refused.status_code == 403, refused.text
            assert client.get("/runs/refund-1", headers=auth(token)).status_code == 403
        assert client.get("/runs/trip-1", headers=auth(DAVE)).status_code == 200
        assert rt.engine.store.approval(ask.approval_id).status == "pending"
        decided = client.post(
            f"/approvals/{ask.approval_id}/decision", json={"approve": True}, headers=auth(DAVE)
        )
        assert decided.status_code == 200, decided.text
    assert rt.resume("trip-1").status is RunStatus.COMPLETED
    assert lines(tmp_path / "effects") == []


@pytest.mark.parametrize(
    ("entry", "message"),
    [
        ({"token": CAROL, "gates": []}, "gates"),
        ({"token": CAROL, "gates": "refund"}, "gates"),
        ({"token": CAROL, "gates": [""]}, "gates"),
        ({"token": CAROL, "owners": ["a\x00"]}, "owners"),
        ({"token": CAROL, "owners": [5]}, "owners"),
        ({"token": CAROL, "gate": ["refund"]}, "gate"),
        ({"gates": ["refund"]}, "token"),
        ({"token": "short", "gates": ["refund"]}, "at least 16"),
        ({"token": ALICE}, "share a token"),
        (["refund"], "token"),
    ],
)
def test_bad_scoped_tokens_are_refused(sqlite_url: str, entry: Any, message: str) -> None:
    """A scope that is empty, misspelt or not a list would widen or void a token: the app is not built."""
    from statekeep.web import create_app

    store = SQLWorkflowStore(sqlite_url)
    with pytest.raises(ConfigError, match=message):
        create_app(store, tokens={**TOKENS, "carol@example.com": entry})
    store.close()
