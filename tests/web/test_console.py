"""The console's API and pages over HTTP (no browser): login, scopes, runs, timelines, contexts,
working state, memory; on SQLite with LanceDB and on PostgreSQL with pgvector."""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from typing import Any

import pytest
from fastapi.testclient import TestClient

from statekeep.config import Settings
from statekeep.memory import FakeEmbedder
from statekeep.web import Stores, create_app
from statekeep.web.access import Access
from statekeep.workflow import WorkflowStore
from tests.runtime import agent_app

ALICE, CAROL, DAVE = "alice-token-0123456789", "carol-token-0123456789", "dave-token-0123456789a"
TOKENS: dict[str, Any] = {
    "alice@example.com": ALICE,
    "carol@example.com": {"token": CAROL, "owners": ["owner-2"]},
    "dave@example.com": {"token": DAVE, "gates": ["send"]},
}
HTML = {"Accept": "text/html"}


def bearer(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


@pytest.fixture
def console(settings: Settings) -> Iterator[tuple[TestClient, WorkflowStore]]:
    """trip-1 (owner-1) waits for approval; trip-2 (owner-2) is pending; the console over them."""
    rt = agent_app.build_runtime(settings)
    rt.run(agent_app.AGENT, "trip-1", owner="owner-1", task="Plan a trip")
    rt.start(agent_app.AGENT, "trip-2", owner="owner-2", task="Plan another trip")
    rt.remember("Owner two likes trains", owner="owner-2")
    rt.close()
    stores = Stores.open(settings, embedder=FakeEmbedder())
    app = create_app(stores.workflow, tokens=TOKENS, stores=stores)
    with TestClient(app, base_url="https://testserver") as client:
        yield client, stores.workflow
    stores.close()


def login(client: TestClient, token: str = ALICE) -> None:
    response = client.post("/login", data={"token": token, "next": "/runs"}, follow_redirects=False)
    assert response.status_code == 303, response.text


def test_a_browser_logs_in_with_a_token_and_keeps_a_signed_cookie(
    console: tuple[TestClient, WorkflowStore],
) -> None:
    client, _ = console
    redirected = client.get("/runs?status=pending", headers=HTML, follow_redirects=False)
    assert (redirected.status_code, redirected.headers["location"]) == (
        303,
        "/login?next=%2Fruns%3Fstatus%3Dpending",
    )
    assert client.get("/api/runs", headers=HTML).status_code == 401  # the API never redirects
    refused = client.post("/login", data={"token": "wrong-token-000000000", "next": "/"})
    assert refused.status_code == 401
    assert "not a valid token" in refused.text
    response = client.post(
        "/login", data={"token": ALICE, "next": "https://evil.example/"}, follow_redirects=False
    )
    assert response.headers["location"] == "/"  # never another site
    cookie = response.headers["set-cookie"]
    for flag in ("HttpOnly", "Secure", "SameSite=strict", "Max-Age=43200"):
        assert flag.lower() in cookie.lower(), cookie
    assert ALICE not in cookie
    page = client.get("/runs", headers=HTML)
    assert page.status_code == 200
    assert "alice@example.com" in page.text
    assert client.get("/api/me").json() == {
        "identity": "alice@example.com",
        "scope": "every run, approval and owner",
    }
    (ask,) = client.get("/api/approvals").json()  # the cookie reads the API, but changes nothing through it
    refused = client.post(f"/api/approvals/{ask['approval_id']}/decision", json={"approve": True})
    assert (refused.status_code, refused.json()["error"]) == (403, "Forbidden")
    assert client.delete("/api/memory/owner-2?confirm=owner-2").status_code == 403
    assert client.post(f"/approvals/{ask['approval_id']}/decision", json={"approve": True}).status_code == 403
    csrf = re.search(r'name="csrf" value="([^"]+)"', page.text)
    assert csrf is not None
    assert client.post("/logout", data={"csrf": "forged"}).status_code == 403
    out = client.post("/logout", data={"csrf": csrf.group(1)}, follow_redirects=False)
    assert out.status_code == 303
    assert client.get("/runs", headers=HTML, follow_redirects=False).status_code == 303


def test_session_cookies_are_signed_expire_and_end_with_their_token() -> None:
    access = Access({"alice@example.com": ALICE})
    grant = access.grants[0]
    cookie = access.session(grant, now=1000.0)
    assert access.by_cookie(cookie, now=1001.0) == grant
    assert access.by_cookie(cookie, now=1000.0 + 13 * 3600) is None  # expired
    ident, expires, signature = cookie.split(".")
    assert access.by_cookie(f"{ident}.{int(expires) + 3600}.{signature}", now=1001.0) is None  # extended
    assert access.by_cookie(cookie.replace(ident, "Ym9iQGV4YW1wbGUuY29t"), now=1001.0) is None  # bob
    assert Access({"alice@example.com": "another-token-0123456"}).by_cookie(cookie, now=1001.0) is None
    assert access.by_cookie("garbage", now=1001.0) is None


def test_runs_are_newest_first_counted_filtered_and_scoped(console: tuple[TestClient, WorkflowStore]) -> None:
    client, _ = console
    page = client.get("/api/runs", headers=bearer(ALICE)).json()
    assert [r["run_id"] for r in page["runs"]] == ["trip-2", "trip-1"]
    assert (page["total"], page["counts"]) == (2, {"pending": 1, "waiting_for_approval": 1})
    assert page["workflows"] == ["agent.trip"]
    filtered = client.get("/api/runs?status=waiting_for_approval", headers=bearer(ALICE)).json()
    assert [r["run_id"] for r in filtered["runs"]] == ["trip-1"]
    assert filtered["counts"] == page["counts"]  # counts ignore the status filter
    assert client.get("/api/runs?owner=owner-2", headers=bearer(ALICE)).json()["total"] == 1
    # inputs are sealed with their owner's key; the text filter still matches what a run was told
    found = client.get("/api/runs?q=ANOTHER", headers=bearer(ALICE)).json()
    assert [r["run_id"] for r in found["runs"]] == ["trip-2"]
    assert client.get("/api/runs?q=IP-2", headers=bearer(ALICE)).json()["runs"][0]["run_id"] == "trip-2"
    assert (
        client.get("/api/runs?limit=1&offset=1", headers=bearer(ALICE)).json()["runs"][0]["run_id"]
        == "trip-1"
    )
    # carol sees owner-2's runs; dave sees the runs with a "send" approval
    assert [r["run_id"] for r in client.get("/api/runs", headers=bearer(CAROL)).json()["runs"]] == ["trip-2"]
    assert client.get("/api/runs?owner=owner-1", headers=bearer(CAROL)).json()["total"] == 0
    assert [r["run_id"] for r in client.get("/api/runs", headers=bearer(DAVE)).json()["runs"]] == ["trip-1"]
    for path in ("/api/runs/trip-1", "/api/runs/trip-1/timeline", "/api/runs/trip-1/model-calls"):
        assert client.get(path, headers=bearer(CAROL)).status_code == 403
    assert client.get("/api/runs/trip-1", headers=bearer(DAVE)).status_code == 200
    assert client.get("/api/runs/nope", headers=bearer(ALICE)).status_code == 404


def test_a_run_shows_its_timeline_contexts_usage_and_state_versions(
    console: tuple[TestClient, WorkflowStore],
) -> None:
    client, _ = console
    run = client.get("/api/runs/trip-1", headers=bearer(ALICE)).json()
    assert (run["status"], run["owner"]) == ("waiting_for_approval", "owner-1")
    assert run["usage"]["calls"] == 3
    assert run["usage"]["context"] > 0
    (pending,) = run["approvals"]
    assert pending["deciders"] == ["alice@example.com", "dave@example.com"]
    timeline = client.get("/api/runs/trip-1/timeline", headers=bearer(ALICE)).json()
    kinds = [e["kind"] for e in timeline]
    assert kinds[:3] == ["step", "model", "tool"]
    assert kinds[-2:] == ["approval", "wait"]
    tool = timeline[2]
    assert (tool["name"], tool["status"], tool["data"]["key"]) == ("lookup", "completed", "trip-1/3/0")
    calls = client.get("/api/runs/trip-1/model-calls", headers=bearer(ALICE)).json()
    assert [c["turn"] for c in calls] == [0, 1, 2]
    last = calls[-1]["context"]
    sections = {s["name"]: s for s in last["sections"]}
    assert list(sections) == ["system", "pinned", "memories", "window"]
    assert sections["system"]["messages"] == [{"role": "system", "content": "You plan trips."}]
    assert last["total"] == sum(s["tokens"] for s in last["sections"]) + last["reply_overhead"]
    assert calls[-1]["usage"] == {"prompt": 0, "completion": 0, "cached": 0}
    states = client.get("/api/runs/trip-1/states", headers=bearer(ALICE)).json()
    assert [s["version"] for s in states] == list(range(1, len(states) + 1))
    assert client.get("/api/runs/trip-1/states/1", headers=bearer(ALICE)).json()["turn"] == 0
    diff = client.get("/api/runs/trip-1/states/diff?a=1&b=2", headers=bearer(ALICE)).json()["diff"]
    assert '-  "turn": 0,' in diff
    assert '+  "turn": 1,' in diff
    page = client.get("/runs/trip-1", headers={**HTML, **bearer(ALICE)})
    assert page.status_code == 200
    assert "Current task state (pinned)" in page.text
    assert "trip-1/3/0" in page.text


def test_pages_work_without_script_and_forbid_any(console: tuple[TestClient, WorkflowStore]) -> None:
    client, _ = console
    login(client)
    (ask,) = client.get("/api/approvals").json()
    for path in (
        "/",
        "/runs?status=pending&workflow=agent.trip&owner=owner-2&q=trip",
        "/runs/trip-1?a=1&b=3",
        "/approvals",
        "/approvals?status=all",
        f"/approvals/{ask['approval_id']}",
        "/memory",
        "/memory?owner=owner-2",
        "/memory?owner=owner-2&q=trains",
        "/memory/erase?owner=owner-2",
        "/docs",
    ):
        page = client.get(path, headers=HTML)
        assert page.status_code == 200, (path, page.text[:300])
        assert "<script" not in page.text
        assert "default-src 'none'" in page.headers["content-security-policy"]
    missing = client.get("/runs/nope", headers=HTML)
    assert missing.status_code == 404
    assert "<h1>404" in missing.text
    assert client.get("/static/console.css").status_code == 200


def test_a_decision_from_the_page_is_recorded_as_the_logged_in_person(
    console: tuple[TestClient, WorkflowStore],
) -> None:
    client, store = console
    login(client)
    (ask,) = client.get("/api/approvals").json()
    page = client.get(f"/approvals/{ask['approval_id']}", headers=HTML).text
    csrf = re.search(r'name="csrf" value="([^"]+)"', page)
    assert csrf is not None
    path = f"/approvals/{ask['approval_id']}/decide"
    forged = client.post(path, data={"decision": "approve", "csrf": "nope"}, headers=HTML)
    assert forged.status_code == 403
    assert store.approval(ask["approval_id"]).status == "pending"
    done = client.post(
        path, data={"decision": "approve", "comment": "fine", "csrf": csrf.group(1)}, headers=HTML
    )
    assert done.status_code == 200
    assert "Recorded: approved by alice@example.com" in done.text
    decided = store.approval(ask["approval_id"])
    assert (decided.status, decided.decided_by, decided.comment) == ("approved", "alice@example.com", "fine")


def test_the_webhooks_first_paths_still_answer_json(console: tuple[TestClient, WorkflowStore]) -> None:
    client, _ = console
    listed = client.get("/approvals", headers=bearer(ALICE))
    assert listed.headers["content-type"] == "application/json"
    assert listed.json()[0]["action"] == "send"
    assert client.get("/runs/trip-1", headers=bearer(ALICE)).json()["status"] == "waiting_for_approval"
    assert '<h1 class="id">trip-1' in client.get("/runs/trip-1", headers={**HTML, **bearer(ALICE)}).text


def test_memory_is_listed_searched_exported_and_erased_within_scope(
    console: tuple[TestClient, WorkflowStore], settings: Settings
) -> None:
    client, _ = console
    listed = client.get("/api/memory/owner-2", headers=bearer(ALICE)).json()
    assert [m["content"] for m in listed["memories"]] == ["Owner two likes trains"]
    assert listed["memories"][0]["source"] == "agent_inferred"
    found = client.get("/api/memory/owner-2?q=trains", headers=bearer(CAROL)).json()
    assert found["memories"][0]["score"] is not None
    exported = client.get("/api/memory/owner-2/export", headers=bearer(CAROL))
    assert "attachment" in exported.headers["content-disposition"]
    assert json.loads(exported.text)["count"] == 1
    for token, owner in ((CAROL, "owner-1"), (DAVE, "owner-2")):  # another owner; a gates-only token
        assert client.get(f"/api/memory/{owner}", headers=bearer(token)).status_code == 403
    unconfirmed = client.delete("/api/memory/owner-2?confirm=owner-1", headers=bearer(ALICE))
    assert unconfirmed.status_code == 422
    if settings.memory.backend == "lancedb":  # a worker holding the folder for writing: 409, nothing erased
        from statekeep.memory import open_memory_store

        with open_memory_store(settings.memory_url, FakeEmbedder()):
            held = client.delete("/api/memory/owner-2?confirm=owner-2", headers=bearer(CAROL))
            assert held.status_code == 409
            assert "another writer" in held.json()["detail"]
    receipt = client.delete("/api/memory/owner-2?confirm=owner-2", headers=bearer(CAROL)).json()
    assert (receipt["owner"], receipt["removed"]) == ("owner-2", 1)
    assert client.get("/api/memory/owner-2", headers=bearer(ALICE)).json()["memories"] == []


def test_the_approvals_page_links_to_the_next_page_when_full(
    settings: Settings, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A page of the oldest approvals, and a link to the next one while the page is full."""
    from statekeep.web import pages

    rt = agent_app.build_runtime(settings)
    for i in range(3):
        rt.run(agent_app.AGENT, f"trip-{i}", owner="owner-1", task="Plan a trip")
    rt.close()
    monkeypatch.setattr(pages, "APPROVALS_PAGE", 2)
    stores = Stores.open(settings, embedder=FakeEmbedder())
    every = [a.approval_id for a in stores.workflow.approvals(status=None)]
    assert len(every) == 3
    try:
        with TestClient(create_app(stores.workflow, tokens=TOKENS, stores=stores)) as client:
            first = client.get("/approvals?status=all", headers={**HTML, **bearer(ALICE)}).text
            assert [i for i in every if i in first] == every[:2]
            (following,) = re.findall(r'<a rel="next" href="([^"]+)"', first)
            assert following.endswith(f"/approvals?status=all&amp;after={every[1]}")
            last = client.get(following.replace("&amp;", "&"), headers={**HTML, **bearer(ALICE)}).text
            assert [i for i in every if i in last] == every[2:]
            assert 'rel="next"' not in last
            assert "← Oldest" in last
    finally:
        stores.close()
