"""The audit log (append-only, no content), the CLI's erase and audit commands, and the webhook's records."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import sqlalchemy as sa
from fastapi.testclient import TestClient

from statekeep.audit import AuditLog, entries_table
from statekeep.config import Settings
from statekeep.db import Database
from statekeep.errors import InvalidInputError, StorageError
from statekeep.memory import FakeEmbedder
from statekeep.runtime import Runtime
from statekeep.workflow import RunStatus
from tests.privacy.conftest import Cli, Person, populate


def _release_memory(runtime: Runtime) -> None:
    """A LanceDB folder has one writer: let the command open it."""
    runtime.memory.close()
    runtime._memory = None


def test_the_audit_log_is_append_only_and_holds_counts_not_content(database_url: str) -> None:
    """UPDATE and DELETE are refused by the database; a detail that is not a count or an id is refused."""
    log = AuditLog(database_url)
    entry = log.record("dpo@example.com", "erase", "alice", detail={"context.events": 4})
    assert log.entries()[0] == entry
    with pytest.raises(InvalidInputError):
        log.record("x", "erase", "alice", detail={"content": 1.5})  # type: ignore[dict-item]
    with pytest.raises(InvalidInputError):
        log.record("x", "paint", "alice")  # type: ignore[arg-type]
    for statement in (entries_table.update().values(actor="mallory"), entries_table.delete()):
        with pytest.raises(StorageError, match="append-only"), log.db.begin() as conn:
            conn.execute(statement)
    assert [e.actor for e in log.entries()] == ["dpo@example.com"]
    log.db.dispose()


def test_cli_erase_refuses_live_runs_then_cancels_them_and_prints_the_receipt(
    settings: Settings,
    runtime: Runtime,
    cli: Cli,
) -> None:
    """`statekeep erase OWNER --yes` refuses a live run; --cancel-live erases; `statekeep audit` shows who."""
    alice = Person("alice")
    runs = populate(runtime, alice, gated=True)
    _release_memory(runtime)
    code, out = cli("erase", "alice", "--yes")
    assert code == 1
    assert "live run" in out
    assert runs["gated"] in out
    code, out = cli("--as", "dpo@example.com", "erase", "alice", "--yes", "--cancel-live")
    assert code == 0, out
    receipt = json.loads(out)
    assert receipt["cancelled"] == [runs["gated"]]
    assert receipt["workflow"]["runs"] == 2
    assert receipt["keys"] == {"data_keys": 1}
    assert receipt["memory"]["removed"] == 1
    assert len(set(receipt["locations"])) == len(receipt["locations"])  # each database scrubbed, named once
    assert runtime.engine.store.runs_of("alice") == []
    code, out = cli("audit", "--json", "--action", "erase")
    assert code == 0, out
    [entry] = [json.loads(line) for line in out.splitlines()]
    assert (entry["actor"], entry["target"], entry["via"]) == ("dpo@example.com", "alice", "cli")
    assert entry["detail"]["workflow.runs"] == 2
    assert not any(m in out for m in alice.markers.values())


def test_cli_cancel_decisions_and_memory_reads_are_audited(
    settings: Settings,
    runtime: Runtime,
    cli: Cli,
) -> None:
    """Cancelling, approving, reading and exporting memories each leave one record, with the actor."""
    bob = Person("bob")
    runs = populate(runtime, bob, gated=True)
    [approval] = runtime.engine.store.approvals(run_id=runs["gated"])
    _release_memory(runtime)
    assert cli("--as", "ops@example.com", "approvals", "approve", approval.approval_id, "--by", "ops")[0] == 0
    assert runtime.engine.store.get(runs["gated"]).status is RunStatus.PENDING
    assert cli("--as", "ops@example.com", "runs", "cancel", runs["gated"])[0] == 0
    assert cli("--as", "support@example.com", "memory", "search", "bob", "note")[0] == 0
    assert cli("--as", "support@example.com", "memory", "export", "bob")[0] == 0
    assert cli("--as", "support@example.com", "memory", "list", "bob")[0] == 0
    assert cli("--as", "support@example.com", "runs", "show", runs["first"])[0] == 0
    assert cli("--as", "support@example.com", "runs", "events", runs["first"])[0] == 0
    code, out = cli("audit", "--json")
    assert code == 0, out
    entries = [json.loads(line) for line in out.splitlines()]
    assert [(e["action"], e["actor"], e["target"]) for e in entries] == [
        ("read_run", "support@example.com", runs["first"]),
        ("read_run", "support@example.com", runs["first"]),
        ("read_memories", "support@example.com", "bob"),
        ("export", "support@example.com", "bob"),
        ("read_memories", "support@example.com", "bob"),
        ("cancel", "ops@example.com", runs["gated"]),
        ("approve", "ops@example.com", approval.approval_id),
    ]
    assert not any(m in out for m in bob.markers.values())
    code, out = cli("audit")
    assert code == 0
    assert "read_memories" in out


def test_webhook_decisions_are_audited_with_the_token_holder(settings: Settings, runtime: Runtime) -> None:
    """A decision over HTTP records the token's person, the approval and the run."""
    from statekeep.web import create_app

    bob = Person("bob")
    runs = populate(runtime, bob, gated=True)
    [approval] = runtime.engine.store.approvals(run_id=runs["gated"])
    assert approval.args == {"args": [], "kwargs": {"body": bob.markers["gated"]}}  # opened for the person
    tokens = {"alice@example.com": "alice-token-0123456789"}
    with TestClient(create_app(runtime.engine.store, tokens=tokens)) as client:
        shown = client.get(
            f"/approvals/{approval.approval_id}",
            headers={"Authorization": f"Bearer {tokens['alice@example.com']}"},
        )
        assert shown.json()["args"]["kwargs"]["body"] == bob.markers["gated"]
        decided = client.post(
            f"/approvals/{approval.approval_id}/decision",
            json={"approve": False, "comment": f"no, {bob.markers['memory']}"},
            headers={"Authorization": f"Bearer {tokens['alice@example.com']}"},
        )
        assert decided.status_code == 200, decided.text
        assert decided.json()["comment"] == f"no, {bob.markers['memory']}"
    assert runtime.audit is not None
    [entry] = runtime.audit.entries(action="reject")
    assert (entry.actor, entry.target, entry.via) == ("alice@example.com", approval.approval_id, "webhook")
    assert entry.detail == {"run": runs["gated"]}
    assert bob.markers["memory"] not in json.dumps(entry.as_dict())


def test_console_reads_of_memories_context_and_state_are_audited(
    settings: Settings, runtime: Runtime
) -> None:
    """Listing or searching an owner's memories, a run's model calls (the exact context sent) and its
    working state, over the API or as pages, each leave a record naming the token's person."""
    from statekeep.web import Stores, create_app

    bob = Person("bob")
    runs = populate(runtime, bob, gated=False)
    _release_memory(runtime)
    run = runs["first"]
    tokens = {"support@example.com": "support-token-0123456789"}
    stores = Stores.open(settings, embedder=FakeEmbedder())
    headers = {"Authorization": f"Bearer {tokens['support@example.com']}"}
    app = create_app(stores.workflow, tokens=tokens, stores=stores)
    with TestClient(app, base_url="https://testserver") as client:
        version = client.get(f"/api/runs/{run}/states", headers=headers).json()[-1]["version"]
        for path in (
            "/api/memory/bob",
            "/api/memory/bob?q=note",
            f"/api/runs/{run}/model-calls",
            f"/api/runs/{run}/states/{version}",
        ):
            answer = client.get(path, headers=headers)
            assert answer.status_code == 200, (path, answer.text)
        login = {"token": tokens["support@example.com"], "next": "/runs"}
        assert client.post("/login", data=login, follow_redirects=False).status_code == 303
        page = client.get(f"/runs/{run}", headers={"Accept": "text/html"})
        assert page.status_code == 200
        assert "<html" in page.text
    assert runtime.audit is not None
    entries = [(e.action, e.target, e.via, e.actor) for e in reversed(runtime.audit.entries())]
    who = ("webhook", "support@example.com")
    assert entries[:4] == [
        ("read_memories", "bob", *who),
        ("read_memories", "bob", *who),
        ("read_context", run, *who),
        ("read_state", run, *who),
    ]
    assert {e[0] for e in entries[4:]} == {"read_run", "read_context", "read_state"}  # the run's page
    assert all(e[1:] == (run, *who) for e in entries[4:])
    dump = json.dumps([e.as_dict() for e in runtime.audit.entries()])
    assert not any(m in dump for m in bob.markers.values())
    stores.workflow.close()


def test_runs_record_their_owner_and_children_inherit_it(database_url: str) -> None:
    """Registry.workflow(owner=...) names the parameter; a child run holds its parent's owner."""
    from statekeep.workflow import Engine, Registry, RunContext

    registry = Registry()

    @registry.workflow("child")
    def child(ctx: RunContext, n: int) -> int:
        return n + 1

    @registry.workflow("parent", owner="customer")
    def parent(ctx: RunContext, customer: str) -> int:
        return int(ctx.child(child, "kid-1", 1))

    with pytest.raises(InvalidInputError, match="no parameter"):
        registry.workflow("bad", owner="nobody")(lambda ctx, who: who)
    engine = Engine(database_url, registry)
    assert engine.run(parent, "p-1", "carol").output == 2
    assert {r.run_id: r.owner for r in engine.store.runs_of("carol")} == {"p-1": "carol", "kid-1": "carol"}
    with pytest.raises(InvalidInputError, match="customer"):
        engine.run(parent, "p-2", "")
    engine.store.close()


def test_workflow_4_records_the_owner_of_runs_started_before_owners(
    database_url: str, tmp_path: Path
) -> None:
    """A version-3 database's agent runs get their owner from their (plain) input on upgrade."""
    from statekeep.db import upgrade
    from statekeep.db.migrations import current_version
    from statekeep.workflow import tables

    db = Database(database_url)
    upgrade(db, "workflow", tables.SCHEMA, tables.MIGRATIONS[:3])
    table = "runs" if db.name == "sqlite" else f"{tables.SCHEMA}.runs"
    index = (
        "ix_statekeep_workflow_runs_owner"
        if db.name == "sqlite"
        else f"{tables.SCHEMA}.ix_statekeep_workflow_runs_owner"
    )
    with db.begin() as conn:  # version 1 built runs from today's metadata: take the column away
        conn.execute(sa.text(f"DROP INDEX {index}"))
        conn.execute(sa.text(f"ALTER TABLE {table} DROP COLUMN owner"))
        for run_id, workflow, args in (
            ("a-1", "agent.helper", ["dora", "s-1", "a task"]),
            ("w-1", "billing", ["dora"]),
        ):
            conn.execute(
                sa.text(
                    f"INSERT INTO {table} (run_id, workflow, version, input, input_hash, status, created_at, "
                    "updated_at, epoch, last_seq) VALUES (:r, :w, 1, :i, 'h', 'completed', :t, :t, 0, 0)"
                ),
                {
                    "r": run_id,
                    "w": workflow,
                    "i": json.dumps({"args": args, "kwargs": {}}),
                    "t": "2024-01-01",
                },
            )
    tables.setup(db)
    assert current_version(db, "workflow", tables.SCHEMA) == len(tables.MIGRATIONS)
    with db.read() as conn:
        owners: dict[str, str | None] = {
            str(r[0]): r[1] for r in conn.execute(sa.text(f"SELECT run_id, owner FROM {table}"))
        }
    assert owners == {"a-1": "dora", "w-1": None}  # only agent runs say whose they are
    db.dispose()
