"""The event log: input checks, lazy imports and the SQL backend's own details (shared database, cache).

The log's invariants (gap-free seqs, tokens counted at append, idempotency keys) are
in the conformance suite.
"""

from __future__ import annotations

import math
import os
import subprocess
import sys
import threading
from pathlib import Path

import pytest
import sqlalchemy as sa

import statekeep
from statekeep.context import (
    CharCounter,
    ContextStore,
    Message,
    SQLContextStore,
    TiktokenCounter,
    ToolCall,
    message_tokens,
)
from statekeep.context.sql import events, sessions
from statekeep.context.window import is_well_paired
from statekeep.db import Database
from statekeep.errors import InvalidInputError, SealedDataError, StatekeepError, StorageError
from statekeep.working import SQLWorkingStateStore

from .conftest import StoreFactory


def test_message_overhead_is_counted() -> None:
    """Every message costs its text plus a fixed chat-format overhead; a name costs more."""
    counter = CharCounter(1)
    assert message_tokens(counter, Message.user("abcd")) == 4 + 3
    assert message_tokens(counter, Message.user("abcd", name="ab")) == 4 + 3 + 1 + 2


@pytest.mark.parametrize(
    ("message", "field"),
    [
        ({"content": "no role"}, "message.role"),
        (Message("user", "x", tool_calls=(ToolCall("c", "t"),)), "message.tool_calls"),
        (Message("tool", "result without a call id"), "message.tool_call_id"),
        (Message.assistant(""), "message"),
        (Message.assistant("x", tool_calls=[ToolCall("c", "t"), ToolCall("c", "u")]), "tool_call.id"),
        (Message.assistant("x", tool_calls=[ToolCall("c", "")]), "tool_call.name"),
        (Message.assistant("x", tool_calls=[ToolCall("c", "t", {"v": math.nan})]), "message"),
        (Message.assistant("x", tool_calls=[ToolCall("c", "t", {"v": object()})]), "message"),
        ("just text", "message"),
        (Message.user("half a pair \ud83d"), "message"),  # a lone surrogate cannot be stored
        (Message.assistant("x", tool_calls=[ToolCall("c", "t", {"v": "\udfff"})]), "message"),
    ],
)
def test_bad_messages_are_refused_and_write_nothing(store: ContextStore, message: object, field: str) -> None:
    """Malformed messages raise InvalidInputError naming the field; the log stays empty."""
    with pytest.raises(InvalidInputError) as err:
        store.append("s", message)  # type: ignore[arg-type]
    assert err.value.field == field
    assert store.last_seq("s") == 0


@pytest.mark.parametrize("session_id", ["", "x" * 256, None, 7, "a\x00b", "\ud800"])
def test_bad_session_ids_are_refused(store: ContextStore, session_id: object) -> None:
    """A session id must be a non-empty string of at most 255 characters that every backend stores."""
    with pytest.raises(InvalidInputError) as err:
        store.append(session_id, Message.user("x"))  # type: ignore[arg-type]
    assert err.value.field == "session_id"
    with pytest.raises(StatekeepError):
        store.build(session_id, 100)  # type: ignore[arg-type]


def test_store_shares_a_database_with_other_stores(database_url: str) -> None:
    """Built from a shared Database, the context tables live beside the working-state tables."""
    db = Database(database_url)
    context = SQLContextStore(db)
    working = SQLWorkingStateStore(db)
    assert context.db is working.db
    assert context.append("s", Message.user("x")).seq == 1
    expected = {"context_events", "context_sessions", "context_migrations"}
    schema = "statekeep_context" if db.dialect.has_schemas else None
    with db.read() as conn:
        assert expected <= set(sa.inspect(conn).get_table_names(schema=schema))
    db.dispose()


def test_importing_the_context_store_does_not_load_tiktoken() -> None:
    """tiktoken is imported lazily, on the first count."""
    code = "import sys, statekeep.context; print('tiktoken' in sys.modules)"
    env = {**os.environ, "PYTHONPATH": str(Path(statekeep.__file__).parents[1])}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, env=env)
    assert out.stdout.strip() == "False"


def test_bad_counters_summarizers_and_marks_are_refused(make_store: StoreFactory) -> None:
    """Constructor and entry points check their collaborators and say which argument is wrong."""
    cases: list[tuple[dict[str, object], str]] = [
        ({"counter": "tiktoken"}, "counter"),
        ({"summarizer": len}, "summarizer"),
        ({"high_water": 1.5}, "high_water"),
        ({"high_water": 0.5, "low_water": 0.6}, "low_water"),
    ]
    for kwargs, field in cases:
        with pytest.raises(InvalidInputError) as err:
            make_store(**kwargs)
        assert err.value.field == field
    store = make_store()
    store.append("s", Message.user("x"))
    with pytest.raises(InvalidInputError, match="counter"):
        store.build("s", 100, counter=object())  # type: ignore[arg-type]
    with pytest.raises(InvalidInputError, match="summarizer"):
        store.compact("s", summarizer=object())  # type: ignore[arg-type]
    with pytest.raises(InvalidInputError, match="upto"):
        store.compact("s", upto=-1)
    assert store.last_seq("s") == 1


def test_an_unknown_tiktoken_encoding_is_an_input_error() -> None:
    """A misspelt encoding fails with an error naming it, not a bare tiktoken ValueError."""
    with pytest.raises(InvalidInputError, match="no encoding 'cl100k_nope'"):
        TiktokenCounter("cl100k_nope").count("x")


@pytest.mark.parametrize("bad", ['{"role":"user","content":"a"},{"role":"user","content":"b"}', "[1]", "{"])
def test_a_corrupt_stored_payload_is_a_storage_error_not_a_shifted_window(sql_url: str, bad: str) -> None:
    """Payloads are decoded a page at a time; a row that is not one object is caught, not misread."""
    store = SQLContextStore(sql_url)
    try:
        store.extend("s", [Message.user("one"), Message.user("two"), Message.user("three")])
        with store.db.begin() as conn:
            conn.execute(sa.update(events).where(events.c.seq == 2).values(payload=bad))
        with pytest.raises(StorageError, match=r"seqs 1\.\.3"):
            store.build("s", 1000)
        fixed = '{"role":"user","content":"2"}'
        with store.db.begin() as conn:
            conn.execute(sa.update(events).where(events.c.seq == 2).values(payload=fixed))
        assert [m.content for m in store.build("s", 1000).messages] == ["one", "2", "three"]
    finally:
        store.db.dispose()


def test_a_stored_message_whose_payload_contradicts_its_kind_still_never_orphans_a_result(
    sql_url: str,
) -> None:
    """Units that fail the pairing check alone send the whole window through it (a tampered row)."""
    store = SQLContextStore(sql_url, counter=CharCounter(1))
    try:
        calls = [ToolCall("c1", "search", {"q": "x"})]
        store.extend(
            "s",
            [
                Message.user("find x"),
                Message.assistant("", tool_calls=calls),
                Message.tool_result("c1", "found"),
                Message.user("thanks"),
            ],
        )
        forged = '{"content":"forged","role":"tool","tool_call_id":"c1"}'  # stored as a user message
        with store.db.begin() as conn:
            conn.execute(sa.update(events).where(events.c.seq == 4).values(payload=forged))
        built = store.build("s", 1000, compact=False)
        assert is_well_paired(built.messages)
        assert [m.content for m in built.messages] == ["find x"]  # the call's block, forged result and all
        assert built.report.orphans_dropped == 3
    finally:
        store.db.dispose()


def test_a_build_reuses_decoded_entries_and_reads_a_session_started_again_afresh(sql_url: str) -> None:
    """Consecutive builds reuse what they decoded; a session erased and started again is read afresh.

    The other store object is on its own Database, as in another process: its
    erasure does not empty this store's cache, the new incarnation does.
    """
    store, other = SQLContextStore(sql_url, counter=CharCounter(1)), SQLContextStore(sql_url)
    try:
        store.extend("s", [Message.user(f"message {i}") for i in range(20)], owner="alice")
        first = store.build("s", 1000, compact=False)
        again = store.build("s", 1000, compact=False)
        assert again.messages == first.messages
        assert all(a is b for a, b in zip(again.messages, first.messages, strict=True))  # not rebuilt
        other.delete_owner("alice")
        texts = [f"massage {i}" if i == 7 else f"message {i}" for i in range(20)]  # same kinds and tokens
        store.extend("s", [Message.user(t) for t in texts], owner="alice")  # written by the other process
        rebuilt = store.build("s", 1000, compact=False)
        assert [m.content for m in rebuilt.messages] == texts
    finally:
        store.db.dispose()
        other.db.dispose()


def test_a_build_reads_again_what_the_cache_lost_after_telling_the_read_it_held_it(sql_url: str) -> None:
    """Rows read by seq only (the cache held them) are read whole when the cache was emptied meanwhile."""
    store = SQLContextStore(sql_url, counter=CharCounter(1))
    try:
        store.extend("s", [Message.user(f"message {i}") for i in range(20)])
        first = store.build("s", 1000, compact=False)
        assert store._entry_cache.span("s", _incarnation(store, "s")) == (1, 20)
        store._entry_cache._rows.clear()  # another thread emptied it between the span and the read
        again = store.build("s", 1000, compact=False)
        assert again.messages == first.messages
        assert all(a is not b for a, b in zip(again.messages, first.messages, strict=True))  # decoded again
    finally:
        store.db.dispose()


def test_erasing_an_owner_drops_their_decoded_entries_from_every_store_object_on_the_database(
    sql_url: str,
) -> None:
    """After delete_owner, no decoded entry (nor cached stretch) of the owner's sessions is in memory."""
    db = Database(sql_url)
    store, worker = SQLContextStore(db, counter=CharCounter(1)), SQLContextStore(db, counter=CharCounter(1))
    try:
        store.extend("s", [Message.user(f"secret {i}") for i in range(10)], owner="alice")
        store.extend("t", [Message.user("kept")], owner="bob")
        worker.build("s", 1000, compact=False)
        worker.build("t", 1000, compact=False)
        store.delete_owner("alice")
        cache = worker._entry_cache
        assert {sid for sid, _ in cache._rows} == {"t"}
        assert "s" not in cache._spans
        assert worker.build("s", 1000, compact=False).messages == ()
        store.extend("s", [Message.user("new owner")], owner="carol")
        assert [m.content for m in worker.build("s", 1000, compact=False).messages] == ["new owner"]
    finally:
        db.dispose()


def test_a_read_begun_before_an_erasure_keeps_nothing_of_what_it_read(sql_url: str) -> None:
    """A build whose read transaction began before delete_owner committed still reads the old rows
    (its snapshot), but leaves none of them, nor their stretch, in the shared cache after the erasure."""
    db = Database(sql_url)
    store = SQLContextStore(db, counter=CharCounter(1))
    try:
        store.extend("s", [Message.user(f"secret {i}") for i in range(10)], owner="alice")
        with store._view() as view:
            assert view.head("s") is not None  # the read transaction's snapshot is taken here
            store.delete_owner("alice")  # commits beside it and empties the cache
            old = view.tail("s", after=0, before=None, limit=100)
        assert [e.seq for e in old] == list(range(10, 0, -1))  # the snapshot still held them
        cache = store._entry_cache
        assert [key for key in cache._rows if key[0] == "s"] == []
        assert "s" not in cache._spans
    finally:
        db.dispose()


def _incarnation(store: SQLContextStore, session_id: str) -> int | None:
    with store.db.read() as conn:
        q = sa.select(sessions.c.incarnation).where(sessions.c.session_id == session_id)
        value: int | None = conn.execute(q).scalar_one()
        return value


def test_the_entry_cache_is_bounded() -> None:
    """The decoded-entry cache empties itself at its size instead of growing with every session."""
    from statekeep.context.sql_cache import EntryCache

    cache = EntryCache(size=10)
    rows = [(seq, "user", f'{{"role":"user","content":"{seq}"}}', 3, "c") for seq in range(1, 8)]
    assert [e.seq for e in cache.entries("a", rows)] == list(range(1, 8))
    assert len(cache._rows) == 7
    assert [e.message.content for e in cache.entries("b", rows)] == [str(s) for s in range(1, 8)]
    assert len(cache._rows) == 7  # 7 + 7 > 10: emptied, then filled with b's
    assert cache.entries("b", rows[:3])[0] is cache.entries("b", rows[:1])[0]


def test_the_entry_cache_is_bounded_in_characters_too() -> None:
    """Large tool results fill the cache by size, not by count; a read bigger than the bound is not kept."""
    from statekeep.context.sql_cache import EntryCache

    big = "x" * 1000
    rows = [(seq, "user", f'{{"role":"user","content":"{big}{seq}"}}', 3, "c") for seq in range(1, 6)]
    cache = EntryCache(size=1000, chars=2500)
    cache.entries("a", rows[:2])
    assert len(cache._rows) == 2
    cache.entries("b", rows[:2])  # 4 payloads > 2,500 characters: emptied first
    assert {sid for sid, _ in cache._rows} == {"b"}
    assert cache._chars <= 2500
    assert [e.seq for e in cache.entries("c", rows)] == [1, 2, 3, 4, 5]  # decoded ...
    assert {sid for sid, _ in cache._rows} == {"b"}  # ... but too big to keep
    cache.forget("b", 1)
    assert set(cache._rows) == {("b", 2)}
    assert cache._chars == len(rows[1][2])


def test_retention_also_drops_the_deleted_events_from_the_entry_cache(sql_url: str) -> None:
    """Raw events deleted by prune_summarized do not live on in the store's memory."""
    store = SQLContextStore(sql_url, counter=CharCounter(1))
    try:
        store.extend("s", [Message.user(f"message {i}") for i in range(10)])
        store.extend("other", [Message.user("kept")])
        store.build("s", 1000, compact=False)
        store.build("other", 1000, compact=False)
        store.compact("s", upto=6)
        assert store.prune_summarized("s") == 6
        cached = set(store._entry_cache._rows)
        assert not any(sid == "s" and seq <= 6 for sid, seq in cached)
        assert ("other", 1) in cached
        assert [m.content for m in store.build("s", 1000).messages[1:]] == [
            f"message {i}" for i in range(6, 10)
        ]
    finally:
        store.db.dispose()


def test_the_entry_cache_survives_builds_and_retention_on_other_threads() -> None:
    """forget() scans a copy: a build inserting entries on another thread never breaks it."""
    from statekeep.context.sql_cache import EntryCache

    cache = EntryCache(size=1_000_000)
    rows = [(seq, "user", f'{{"role":"user","content":"{seq}"}}', 3, "c") for seq in range(1, 201)]
    for i in range(200):  # a big cache: each scan takes long enough to be interrupted
        cache.entries(f"warm-{i}", rows)
    errors: list[BaseException] = []
    stop = threading.Event()

    def build() -> None:
        i = 0
        while not stop.is_set():
            cache.entries(f"new-{i}", rows[:20])
            i += 1

    thread = threading.Thread(target=build)
    thread.start()
    try:
        for upto in range(0, 200, 10):
            try:
                cache.forget("warm-0", upto)
            except RuntimeError as exc:  # "dictionary changed size during iteration"
                errors.append(exc)
    finally:
        stop.set()
        thread.join()
    assert errors == []
    assert not any(sid == "warm-0" and seq < 190 for sid, seq in cache._rows)


def test_stores_on_one_database_share_decoded_entries_only_with_the_same_key_ring(tmp_path: Path) -> None:
    """A new store object on the same Database reuses decoded entries; one without the key ring refuses."""
    from statekeep.keys import KeyRing, LocalKeyFile

    db = Database(f"sqlite:///{tmp_path}/c.db")
    ring = KeyRing(db, LocalKeyFile(tmp_path / "keys.json"))
    first = SQLContextStore(db, keys=ring)
    first.append("s", Message.user("My PIN is 4711."), owner="alice")
    assert first.build("s", 1000).messages[0].content == "My PIN is 4711."
    again = SQLContextStore(db, keys=ring)
    assert again._entry_cache is first._entry_cache
    assert again.build("s", 1000).messages[0].content == "My PIN is 4711."
    keyless = SQLContextStore(db)
    assert keyless._entry_cache is not first._entry_cache
    with pytest.raises(SealedDataError):
        keyless.build("s", 1000)
    db.dispose()


def test_the_entry_cache_drops_an_erased_incarnation_when_the_session_is_read_again() -> None:
    """A session erased in another process and started again under its id: this process's entries of
    the erased incarnation are never served (another incarnation), and are not kept either."""
    from statekeep.context.sql_cache import EntryCache

    cache = EntryCache(size=1000)
    old = [(seq, "user", f'{{"role":"user","content":"secret {seq}"}}', 3, "c") for seq in range(1, 6)]
    new = [(seq, "user", f'{{"role":"user","content":"fresh {seq}"}}', 3, "c") for seq in range(1, 3)]
    cache.entries("s", old, incarnation=1)
    cache.entries("other", old[:2], incarnation=7)
    assert [e.message.content for e in cache.entries("s", new, incarnation=2)] == ["fresh 1", "fresh 2"]
    kept = [entry.message.content for (sid, _), (_, _, entry) in cache._rows.items() if sid == "s"]
    assert kept
    assert not any("secret" in c for c in kept)
    assert {seq for sid, seq in cache._rows if sid == "s"} == {1, 2}
    assert {seq for sid, seq in cache._rows if sid == "other"} == {1, 2}  # other sessions untouched
    assert cache._chars == sum(len(r[2]) for r in new + old[:2])
    assert cache.span("s", 2) == (1, 2)
    assert cache.span("s", 1) == (None, None)


def test_the_entry_cache_drops_an_erased_incarnation_it_kept_while_emptying_itself() -> None:
    """A read that empties the full cache keeps its rows: they are still known as of their incarnation,
    so reading the session's next incarnation drops them."""
    from statekeep.context.sql_cache import EntryCache

    def row(seq: int, text: str) -> tuple[int, str, str, int, str]:
        return (seq, "user", f'{{"role":"user","content":"{text} {seq}"}}', 3, "c")

    cache = EntryCache(size=4)
    cache.entries("x", [row(seq, "other") for seq in (1, 2, 3)], incarnation=5)
    cache.entries("s", [row(seq, "secret") for seq in (1, 2)], incarnation=1)  # 3 + 2 > 4: emptied first
    assert {seq for sid, seq in cache._rows if sid == "s"} == {1, 2}, "the test must keep the erased rows"
    cache.entries("s", [row(10, "fresh")], incarnation=2)
    assert {key: kept[0] for key, kept in cache._rows.items()} == {("s", 10): 2}
    assert cache._chars == len(row(10, "fresh")[2])
