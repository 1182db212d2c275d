"""Erasure across every store, with one receipt, and nothing of the owner recoverable from any file.

Each backend pair: SQLite + LanceDB (the embedded default) and PostgreSQL + pgvector.
The byte scans read every file of the database (SQLite: the database, its WAL
and shared-memory files; PostgreSQL: every relation file after a CHECKPOINT,
catalogs and pg_statistic included) and of the LanceDB folder (deleted rows
decoded too). They run before the erasure as well, where they must find the
owner's words: a scan that could not see them would prove nothing.
"""

from __future__ import annotations

from pathlib import Path

import psycopg
import pytest
from sqlalchemy.engine import make_url

from statekeep.config import Settings
from statekeep.context import SQLContextStore
from statekeep.errors import LiveRunsError, SealedDataError
from statekeep.memory import FakeEmbedder
from statekeep.memory.lancedb._files import decode_folder
from statekeep.models import ScriptedModel
from statekeep.runtime import Runtime
from tests.privacy.conftest import AGENT, Person, populate, script
from tests.privacy.scan import (
    folder_files,
    plain_hits,
    postgres_files,
    recoverable_hits,
    sqlite_files,
)


def _sql_files(settings: Settings) -> list[Path]:
    url = settings.database_url
    return sqlite_files(url) if url.startswith("sqlite") else postgres_files(url)


def _memory_texts(settings: Settings) -> list[str]:
    if settings.memory.backend == "lancedb":
        return [text for _, text in decode_folder(settings.memory.location)]
    return []


def _memory_files(settings: Settings) -> list[Path]:
    return folder_files(Path(settings.memory.location)) if settings.memory.backend == "lancedb" else []


def _analyze(settings: Settings) -> None:
    if settings.database_url.startswith("postgresql"):
        libpq = make_url(settings.database_url).set(drivername="postgresql").render_as_string(False)
        with psycopg.connect(libpq, autocommit=True) as conn:
            conn.execute("ANALYZE")


def test_erase_owner_leaves_nothing_of_the_owner_in_any_file(settings: Settings, runtime: Runtime) -> None:
    """After erase_owner(alice), no file (nor the key file) gives back alice's words; bob's are intact."""
    alice, bob = Person("alice"), Person("bob")
    alice_runs = populate(runtime, alice, gated=True)
    bob_runs = populate(runtime, bob, gated=False)
    _analyze(settings)  # statistics sample whatever they would: pg_statistic is scanned too
    key_file = settings.home / "keys.json"
    owners = ["alice", "bob"]
    everyone = [*alice.markers.values(), *bob.markers.values()]

    # sealed at rest: no payload marker lies in the SQL files as plain text...
    assert plain_hits(_sql_files(settings), [*alice.sealed.values(), *bob.sealed.values()]) == set()
    # ...but one who holds the disk and the key file opens them all: the scan sees what erasure must remove
    found = recoverable_hits([*_sql_files(settings), *_memory_files(settings)], key_file, owners, everyone)
    assert set(alice.sealed.values()) <= found
    memory_found = plain_hits(
        [*_sql_files(settings), *_memory_files(settings)], everyone, _memory_texts(settings)
    )
    assert alice.markers["memory"] in memory_found

    # a live run is refused, and nothing is erased
    with pytest.raises(LiveRunsError) as refused:
        runtime.erase_owner("alice")
    assert refused.value.run_ids == [alice_runs["gated"]]
    assert runtime.context.sessions_of("alice") == ["alice-s1", "alice-s2"]

    receipt = runtime.erase_owner("alice", cancel_live=True, actor="dpo@example.com")

    assert receipt.cancelled == (alice_runs["gated"],)
    assert receipt.context == {"sessions": 2, "events": receipt.context["events"], "summaries": 1}
    assert receipt.context["events"] >= 6
    assert receipt.workflow["runs"] == 2
    assert receipt.workflow["steps"] > 0
    assert receipt.workflow["tool_calls"] == 1
    assert receipt.workflow["approvals"] == 1
    assert receipt.working["versions"] > 0
    assert receipt.memory is not None
    assert receipt.memory["removed"] == 1
    assert receipt.keys == {"data_keys": 1}
    assert receipt.locations
    assert receipt.not_reached
    backend_line = "write-ahead log" if settings.database_url.startswith("postgresql") else "file system"
    assert any(backend_line in line for line in receipt.not_reached)

    # nothing of alice can be read back, from any file, even with the key file
    files = [*_sql_files(settings), *_memory_files(settings)]
    assert recoverable_hits(files, key_file, owners, alice.markers.values()) == set()
    assert plain_hits(files, alice.markers.values(), _memory_texts(settings)) == set()
    # bob's data is intact, through the API, and the scan still sees his (so it still works)
    bob_sealed = {v for k, v in bob.sealed.items() if k not in ("gated", "task2")}  # bob had no gated run
    assert bob_sealed <= recoverable_hits(files, key_file, owners, bob.markers.values())
    run = runtime.engine.store.get(bob_runs["first"])
    assert bob.markers["reply"] in run.output
    assert bob.markers["args"] in runtime.engine.store.tool_calls(run.run_id)[0].kwargs["query"]
    assert any(bob.markers["task"] in str(e.payload) for e in runtime.context.events("bob-s1", owner="bob"))
    assert runtime.context.latest_summary("bob-s1") is not None
    assert [m.content for m in runtime.memory.list_memories("bob")] == [
        f"bob keeps a note: {bob.markers['memory']}"
    ]
    assert runtime.working.get(bob_runs["first"]).version >= 1
    # and alice is gone from every store's API
    assert runtime.context.sessions_of("alice") == []
    assert runtime.engine.store.runs_of("alice") == []
    assert runtime.memory.list_memories("alice") == []
    assert runtime.engine.store.approvals(status=None, run_id=alice_runs["gated"]) == []
    assert runtime.working.latest_version(alice_runs["first"]) == 0
    # the audit log names the owner and the counts, never the content
    assert runtime.audit is not None
    [entry] = runtime.audit.entries(action="erase")
    assert (entry.actor, entry.target) == ("dpo@example.com", "alice")
    assert entry.detail["context.sessions"] == 2
    assert not any(m in str(entry.as_dict()) for m in alice.markers.values())


def test_a_shredded_key_leaves_sealed_copies_unreadable(settings: Settings, runtime: Runtime) -> None:
    """A copy of a sealed row taken before the erasure (a backup) cannot be opened afterwards."""
    alice = Person("alice")
    populate(runtime, alice, gated=False)
    assert runtime.keys is not None
    [event] = [e for e in runtime.context.events("alice-s1") if e.kind == "user"]
    assert isinstance(runtime.context, SQLContextStore)
    with runtime.context.db.read() as conn:
        stored = conn.exec_driver_sql(
            "SELECT payload FROM "
            + (
                "context_events"
                if runtime.context.db.name == "sqlite"
                else "statekeep_context.context_events"
            )
            + f" WHERE session_id = 'alice-s1' AND seq = {event.seq}"
        ).scalar_one()
    assert stored.startswith("sk1:")
    assert alice.markers["task"] not in stored
    assert alice.markers["task"] in runtime.keys.open(stored)
    runtime.erase_owner("alice")
    runtime.keys.forget_cache()
    with pytest.raises(SealedDataError, match="shredded"):
        runtime.keys.open(stored)


def test_erasing_an_owner_twice_or_an_unknown_owner_is_harmless(settings: Settings, runtime: Runtime) -> None:
    """A second erasure finds nothing and says so; an owner never seen gets an empty receipt."""
    alice = Person("alice")
    populate(runtime, alice, gated=False)
    first = runtime.erase_owner("alice")
    again = runtime.erase_owner("alice")
    assert first.workflow["runs"] == 1
    assert (again.workflow["runs"], again.context["sessions"], again.keys) == (0, 0, {"data_keys": 0})
    nobody = runtime.erase_owner("nobody-ever")
    assert nobody.counts()["context.events"] == 0


def test_the_agent_can_serve_the_owner_again_after_erasure(settings: Settings, runtime: Runtime) -> None:
    """Erasure is not a ban: the same owner id can start over, with a new data key."""
    alice = Person("alice")
    populate(runtime, alice, gated=False)
    runtime.erase_owner("alice")
    again = runtime.run(AGENT, "alice-run-9", owner="alice", task=f"please {alice.markers['task']}")
    assert again.status == "completed"
    assert alice.markers["reply"] in again.output


def test_on_postgres_deleted_rows_stay_readable_until_the_key_is_shredded(
    postgres_url: str, tmp_path: Path
) -> None:
    """Deleting alone leaves dead tuples the key file opens; shredding the data key is what erases them."""
    settings = Settings.load(
        home=tmp_path / "home", database_url=postgres_url, memory_url=postgres_url, env={}
    )
    rt = Runtime.open(settings, model=ScriptedModel(script), embedder=FakeEmbedder())
    try:
        alice = Person("alice")
        populate(rt, alice, gated=False)
        run_ids = [r.run_id for r in rt.engine.store.runs_of("alice")]
        rt.working.delete(*run_ids)
        rt.engine.store.delete_owner("alice")
        rt.context.delete_owner("alice")
        files = postgres_files(postgres_url)
        key_file = settings.home / "keys.json"
        assert plain_hits(files, alice.sealed.values()) == set()
        still = recoverable_hits(files, key_file, ["alice"], alice.sealed.values())
        assert {alice.markers["task"], alice.markers["reply"]} <= still, "dead tuples hold sealed rows"
        assert rt.keys is not None
        rt.keys.shred("alice")
        assert (
            recoverable_hits(postgres_files(postgres_url), key_file, ["alice"], alice.sealed.values())
            == set()
        )
    finally:
        rt.close()
