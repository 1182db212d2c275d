"""PostgreSQL's count of each owner's memories per word (full-text search's common words).

Writes add to the counts and a trigger takes deleted memories away (migration 5);
full-text search reads them instead of counting. Each test compares them with a recount of
the memories themselves.
"""

from __future__ import annotations

import random
import threading
import time
from datetime import timedelta

import psycopg
import pytest

from statekeep.db import Database, upgrade
from statekeep.memory import FakeEmbedder
from statekeep.memory.pgvector import PgVectorMemoryStore
from statekeep.memory.pgvector import _sql as q
from tests.memory.conftest import Clock
from tests.memory.test_pgvector import libpq

Counts = dict[tuple[str, str], int]

KEPT = f"SELECT owner, word, memories FROM {q.WORDS}"
RECOUNT = (
    "SELECT owner, word, count(*) FROM (SELECT owner, unnest(tsvector_to_array(tsv) || '{\"\"}') AS word "
    f"FROM {q.TABLE}) AS s GROUP BY owner, word"
)


def counts(url: str) -> tuple[Counts, Counts]:
    """The counts the triggers kept, and a recount of the memories (as the superuser: every owner)."""
    with psycopg.connect(libpq(url)) as conn:
        kept = {(o, w): n for o, w, n in conn.execute(KEPT)}
        recounted = {(o, w): n for o, w, n in conn.execute(RECOUNT)}
    return kept, recounted


def assert_exact(url: str) -> Counts:
    kept, recounted = counts(url)
    assert kept == recounted
    return kept


def at_schema(url: str, version: int) -> None:
    """The memory schema as the first ``version`` migrations left it, with nothing in it."""
    db = Database(url)
    upgrade(db, "memory", q.SCHEMA, q.MIGRATIONS[:version])
    db.dispose()


def insert_raw(conn: psycopg.Connection, owner: str, texts: list[str]) -> None:
    """Memories ``m0``, ``m1``, ... of ``owner`` as an older schema's store wrote them; each id is its key."""
    vector = "[" + ",".join(["0.125"] * 64) + "]"
    for i, text in enumerate(texts):
        conn.execute(
            f"INSERT INTO {q.TABLE} (owner, id, content, kind, source, trust, model, created_us, "
            "embedding, dedupe_key) VALUES (%s, %s, %s, 'semantic', 'imported', 0.5, "
            "'fake-hash-64', %s, CAST(%s AS vector), %s)",
            (owner, f"m{i}", text, i, vector, f"m{i}"),
        )


def test_word_counts_follow_every_write_and_erasure(postgres_url: str) -> None:
    """Writes, duplicates, supersedes, one memory forgotten, expiry purged, an owner forgotten."""
    clock = Clock()
    store = PgVectorMemoryStore(postgres_url, FakeEmbedder(), clock=clock)
    tea = store.remember_many("alice", ["Alice drinks green tea", "Alice walks her dog", "tea and toast"])[0]
    store.remember("bob", "Bob drinks coffee")
    kept = assert_exact(postgres_url)
    assert kept[("alice", "tea")] == 2
    assert kept[("alice", "")] == 3
    assert kept[("bob", "drink")] == 1
    assert ("bob", "tea") not in kept  # counts are per owner

    again = store.remember("alice", "alice drinks green TEA")  # the same text: nothing stored
    assert again.dedupe is not None
    assert assert_exact(postgres_url) == kept

    store.supersede("alice", tea.id, "Alice drinks black tea")  # the old memory stays, superseded
    kept = assert_exact(postgres_url)
    assert kept[("alice", "tea")] == 3
    assert kept[("alice", "black")] == 1

    store.remember("alice", "a parcel arrives at noon", ttl=timedelta(hours=1))
    assert assert_exact(postgres_url)[("alice", "parcel")] == 1
    clock.now += timedelta(hours=2)
    assert store.purge_expired() == 1
    kept = assert_exact(postgres_url)
    assert ("alice", "parcel") not in kept  # a word no memory holds any more has no row
    assert ("alice", "noon") not in kept

    store.forget_one("alice", tea.id)
    kept = assert_exact(postgres_url)
    assert ("alice", "green") not in kept
    assert kept[("alice", "")] == 3

    store.forget("alice")
    kept = assert_exact(postgres_url)
    assert {o for o, _ in kept} == {"bob"}
    store.close()


def test_writers_of_one_owner_at_once_keep_exact_counts_and_never_deadlock(postgres_url: str) -> None:
    """Four workers write and forget one owner's memories at once, with the same words in any order.

    Each write and each forget updates the word rows its memories hold: were they taken in
    another order than (owner, word), with the owner's count first, two writers would
    wait on each other's rows and one would be killed as a deadlock.
    """
    vocabulary = [f"word{i}" for i in range(40)]
    workers = [PgVectorMemoryStore(postgres_url, FakeEmbedder()) for _ in range(4)]
    errors: list[BaseException] = []
    barrier = threading.Barrier(len(workers))

    def work(n: int) -> None:
        rng = random.Random(n)
        try:
            barrier.wait()
            for r in range(12):
                texts = [" ".join(rng.sample(vocabulary, 12)) + f" w{n}r{r}m{j}" for j in range(6)]
                written = workers[n].remember_many("alice", texts)
                if r % 4 == 3:
                    workers[n].forget_one("alice", written[0].id)
        except BaseException as exc:  # reported below
            errors.append(exc)

    threads = [threading.Thread(target=work, args=(n,)) for n in range(len(workers))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    kept = assert_exact(postgres_url)
    assert kept[("alice", "")] == len(workers) * 12 * 6 - len(workers) * 3
    for worker in workers:
        worker.close()


def test_a_store_of_schema_4_gets_the_counts_of_its_memories(postgres_url: str) -> None:
    """Memories written before migration 5 are counted by it, and full-text search leaves out their
    common words: "alice" is in every memory of hers, so it finds only the memories about tea."""
    at_schema(postgres_url, 4)
    with psycopg.connect(libpq(postgres_url)) as conn:
        insert_raw(
            conn,
            "alice",
            ["Alice drinks tea", "Alice has a dog"] + [f"Alice went to place {i}" for i in range(12)],
        )
        assert conn.execute(f"SELECT to_regclass('{q.WORDS}')").fetchone() == (None,)
    store = PgVectorMemoryStore(postgres_url, FakeEmbedder())
    kept = assert_exact(postgres_url)
    assert kept[("alice", "")] == 14
    assert kept[("alice", "alic")] == 14
    found = [r.memory.content for r in store.search("alice", "What does Alice drink? Tea?", mode="text")]
    assert found == ["Alice drinks tea"]
    store.remember("alice", "Alice likes tea")
    assert assert_exact(postgres_url)[("alice", "tea")] == 2
    store.close()


@pytest.mark.parametrize("prefix", ["worker_", "Worker-"])  # a name that needs quotes, too
def test_a_worker_role_granted_before_migration_5_keeps_working_through_it(
    postgres_url: str, prefix: str
) -> None:
    """A role given ``grant`` at schema 4 writes, searches and erases after the upgrade, not granted again."""
    import uuid

    from sqlalchemy.engine import make_url

    at_schema(postgres_url, 4)
    name = f"{prefix}{uuid.uuid4().hex[:8]}"
    role = f'"{name}"'
    parts = ", ".join(f"{q.TABLE}_p{i}" for i in range(q.PARTITIONS))
    with psycopg.connect(libpq(postgres_url), autocommit=True) as conn:  # what grant() gave at schema 4
        conn.execute(f"CREATE ROLE {role} LOGIN PASSWORD 'pw' NOSUPERUSER NOBYPASSRLS")
        conn.execute(f"GRANT USAGE ON SCHEMA {q.SCHEMA} TO {role}")
        conn.execute(f"GRANT SELECT ON {q.SCHEMA}.memory_migrations TO {role}")
        conn.execute(f"GRANT SELECT, INSERT, UPDATE, DELETE ON {q.TABLE} TO {role}")
        conn.execute(f"GRANT USAGE ON SEQUENCE {q.SEQUENCE} TO {role}")
        conn.execute(f"GRANT MAINTAIN ON {parts} TO {role}")
        conn.execute(f"CREATE ROLE \"{name}r\" LOGIN PASSWORD 'pw' NOSUPERUSER NOBYPASSRLS")  # reads only
        conn.execute(f'GRANT USAGE ON SCHEMA {q.SCHEMA} TO "{name}r"')
        conn.execute(f'GRANT SELECT ON {q.SCHEMA}.memory_migrations, {q.TABLE} TO "{name}r"')
    PgVectorMemoryStore(postgres_url, FakeEmbedder()).close()  # the tables' owner upgrades
    worker_url = make_url(postgres_url).set(username=name, password="pw").render_as_string(False)
    worker = PgVectorMemoryStore(worker_url, FakeEmbedder())
    worker.remember_many("alice", ["Alice drinks tea", "Alice has a dog"])
    assert [r.memory.content for r in worker.search("alice", "tea", mode="text")] == ["Alice drinks tea"]
    reader_url = make_url(postgres_url).set(username=f"{name}r", password="pw").render_as_string(False)
    reader = PgVectorMemoryStore(reader_url, FakeEmbedder())
    assert [r.memory.content for r in reader.search("alice", "tea", mode="text")] == ["Alice drinks tea"]
    reader.close()
    assert worker.forget("alice").removed == 2
    assert assert_exact(postgres_url) == {}
    worker.close()


def test_optimize_full_counts_again_what_was_written_around_the_store(postgres_url: str) -> None:
    """A content changed by SQL is not counted; deleting it then drops a word still held elsewhere,
    and search stops finding it. ``optimize(full=True)`` (as the tables' owner) counts again."""
    store = PgVectorMemoryStore(postgres_url, FakeEmbedder())
    tea, coffee = store.remember_many("alice", ["Alice drinks tea", "Alice drinks coffee"])
    with psycopg.connect(libpq(postgres_url), autocommit=True) as conn:
        conn.execute(f"UPDATE {q.TABLE} SET content = 'Alice drinks tea daily' WHERE id = %s", (coffee.id,))
    store.forget_one("alice", coffee.id)
    kept, recounted = counts(postgres_url)
    assert ("alice", "tea") not in kept
    assert recounted[("alice", "tea")] == 1
    assert store.search("alice", "tea", mode="text") == []
    store.optimize(full=True)
    assert assert_exact(postgres_url)[("alice", "tea")] == 1
    assert [r.memory.id for r in store.search("alice", "tea", mode="text")] == [tea.id]
    store.close()


def test_truncating_the_memories_empties_the_word_counts(postgres_url: str) -> None:
    store = PgVectorMemoryStore(postgres_url, FakeEmbedder())
    store.remember_many("alice", ["Alice drinks tea", "Alice has a dog"])
    with psycopg.connect(libpq(postgres_url), autocommit=True) as conn:
        conn.execute(f"TRUNCATE {q.TABLE}")
    assert assert_exact(postgres_url) == {}
    store.close()


def test_purge_rewrites_the_word_counts_when_the_schema_is_on_the_search_path(postgres_url: str) -> None:
    """The expired memory's words leave no file, though partitions' names then come back without a schema."""
    import uuid

    from sqlalchemy.engine import make_url

    from tests.memory.test_pgvector import files_with

    PgVectorMemoryStore(postgres_url, FakeEmbedder()).close()
    with psycopg.connect(libpq(postgres_url), autocommit=True) as conn:
        name = make_url(postgres_url).database
        conn.execute(f'ALTER DATABASE "{name}" SET search_path = {q.SCHEMA}, public')
    clock = Clock()
    store = PgVectorMemoryStore(postgres_url, FakeEmbedder(), clock=clock)
    marker = f"zq{uuid.uuid4().hex}"
    store.remember("alice", f"Alice's locker code is {marker}.", ttl=timedelta(hours=1))
    store.remember("alice", "Alice keeps this one")
    assert files_with(postgres_url, marker)
    clock.now += timedelta(hours=2)
    assert store.purge_expired() == 1
    assert files_with(postgres_url, marker) == []
    assert_exact(postgres_url)
    store.close()


def test_migration_5_counts_what_a_writer_in_flight_commits(postgres_url: str) -> None:
    """A delete of an older worker, uncommitted when the upgrade starts, is not counted: the upgrade
    waits for it before it counts (else the deleted memories' words would stay, an erased owner's too)."""
    at_schema(postgres_url, 4)
    vector = "[" + ",".join(["0.125"] * 64) + "]"
    with psycopg.connect(libpq(postgres_url), autocommit=True) as conn:
        for i, text in enumerate(["Alice drinks tea", "Bob drinks coffee"]):
            owner = text.split()[0].lower()
            conn.execute(
                f"INSERT INTO {q.TABLE} (owner, id, content, kind, source, trust, model, created_us, "
                "embedding, dedupe_key) VALUES (%s, %s, %s, 'semantic', 'imported', 0.5, "
                "'fake-hash-64', %s, CAST(%s AS vector), %s)",
                (owner, f"m{i}", text, i, vector, f"m{i}"),
            )
    old_worker = psycopg.connect(libpq(postgres_url))
    old_worker.execute(f"DELETE FROM {q.TABLE} WHERE owner = 'bob'")  # its transaction stays open
    opened: list[PgVectorMemoryStore] = []
    upgrading = threading.Thread(
        target=lambda: opened.append(PgVectorMemoryStore(postgres_url, FakeEmbedder()))
    )
    upgrading.start()
    upgrading.join(timeout=2)
    assert upgrading.is_alive()  # waiting for the delete's transaction
    old_worker.commit()
    old_worker.close()
    upgrading.join()
    kept = assert_exact(postgres_url)
    assert {o for o, _ in kept} == {"alice"}
    opened[0].close()


def test_postgres_reads_every_irregular_form_as_its_base(postgres_url: str) -> None:
    """The database's copy of the table (``irregular_bases``) is the Python one, form by form."""
    from statekeep.memory.recall._irregular import BASE

    PgVectorMemoryStore(postgres_url, FakeEmbedder()).close()
    with psycopg.connect(libpq(postgres_url)) as conn:
        rows = conn.execute(
            f"SELECT f, {q.SCHEMA}.irregular_bases(initcap(f) || ' and stone') FROM unnest(%s::text[]) AS f",
            (sorted(BASE),),
        ).fetchall()
    assert dict(rows) == BASE
    with psycopg.connect(libpq(postgres_url)) as conn:
        nots = conn.execute(f"SELECT {q.SCHEMA}.irregular_bases(%s)", ("I won't, WON\u2019T, but I won",))
        assert nots.fetchone() == ("win",)  # "won't" is "will not"


def test_a_store_of_schema_6_reads_irregular_forms_after_the_upgrade(postgres_url: str) -> None:
    """Migration 7 rewrites the text vectors of the memories written before, and counts their words again."""
    at_schema(postgres_url, 6)
    with psycopg.connect(libpq(postgres_url)) as conn:
        texts = ["Alice went to Paris in May", "Paris is lovely", "Alice bought a hat"]
        insert_raw(conn, "alice", texts)
        conn.execute(q.COUNT_WRITTEN.replace(":owner", "'alice'").replace(":ids", "ARRAY['m0','m1','m2']"))
        assert ("alice", "go") not in assert_exact(postgres_url)
    store = PgVectorMemoryStore(postgres_url, FakeEmbedder())
    try:
        kept = assert_exact(postgres_url)
        assert kept[("alice", "go")] == 1
        assert kept[("alice", "went")] == 1
        assert kept[("alice", "")] == 3
        found = [r.memory.content for r in store.search("alice", "Did Alice go to Paris?", mode="text")]
        assert found[0] == texts[0]
        assert [r.memory.content for r in store.search("alice", "what she buys", mode="text")] == [texts[2]]
        store.remember("alice", "Alice flew home")
        assert assert_exact(postgres_url)[("alice", "fli")] == 1
    finally:
        store.close()


def test_migration_7_keeps_text_vectors_in_the_row_and_lets_worker_roles_insert(postgres_url: str) -> None:
    """The rows it rewrites keep their text vectors in the row (migration 5's storage), and a worker role
    granted before it may call ``irregular_bases`` (which every insert computes), even where functions are
    not executable by everyone."""
    import uuid

    from sqlalchemy.engine import make_url

    at_schema(postgres_url, 6)
    rng = random.Random(7)
    long = " ".join("".join(rng.choice("bcdfghjklmnpqrstvwxz") for _ in range(7)) for _ in range(400))
    name = f"worker_{uuid.uuid4().hex[:8]}"
    with psycopg.connect(libpq(postgres_url), autocommit=True) as conn:
        insert_raw(conn, "alice", [long])
        conn.execute(f"CREATE ROLE {name} LOGIN PASSWORD 'pw' NOSUPERUSER NOBYPASSRLS")
        conn.execute(f"GRANT USAGE ON SCHEMA {q.SCHEMA} TO {name}")  # what grant() gave at schema 6
        conn.execute(f"GRANT SELECT ON {q.SCHEMA}.memory_migrations TO {name}")
        conn.execute(f"GRANT SELECT, INSERT, UPDATE, DELETE ON {q.TABLE}, {q.WORDS} TO {name}")
        conn.execute(f"GRANT USAGE ON SEQUENCE {q.SEQUENCE} TO {name}")
        conn.execute("ALTER DEFAULT PRIVILEGES REVOKE EXECUTE ON FUNCTIONS FROM PUBLIC")  # this database only
    PgVectorMemoryStore(postgres_url, FakeEmbedder()).close()  # the tables' owner upgrades
    with psycopg.connect(libpq(postgres_url)) as conn:
        assert conn.execute(f"SELECT pg_column_toast_chunk_id(tsv) FROM {q.TABLE}").fetchall() == [(None,)]
        assert conn.execute(f"SELECT pg_column_size(tsv) > 2100 FROM {q.TABLE}").fetchone() == (True,)
        public = conn.execute(f"SELECT has_function_privilege('public', '{q.IRREGULAR_BASES}', 'EXECUTE')")
        assert public.fetchone() == (False,)  # else this proves nothing
    worker_url = make_url(postgres_url).set(username=name, password="pw").render_as_string(False)
    worker = PgVectorMemoryStore(worker_url, FakeEmbedder())
    try:
        worker.remember("alice", "Alice went to Paris")
        assert [r.memory.content for r in worker.search("alice", "Did Alice go?", mode="text")] == [
            "Alice went to Paris"
        ]
    finally:
        worker.close()


def test_migration_7_waits_for_a_search_under_way_without_a_deadlock(postgres_url: str) -> None:
    """A search reads the word counts, then the memories; the upgrade rewrites the memories, then the
    counts. Emptying the counts with TRUNCATE would wait for the search, which waits for the upgrade."""
    at_schema(postgres_url, 6)
    errors: list[BaseException] = []
    with psycopg.connect(libpq(postgres_url)) as search:
        search.execute(f"SELECT count(*) FROM {q.WORDS}")  # the counts first, as text_sql reads them

        def upgrade_now() -> None:
            try:
                PgVectorMemoryStore(postgres_url, FakeEmbedder()).close()
            except BaseException as exc:
                errors.append(exc)

        upgrading = threading.Thread(target=upgrade_now)
        upgrading.start()
        time.sleep(1.0)  # the upgrade holds the memories now, and rewrites them
        search.execute(f"SELECT count(*) FROM {q.TABLE}")  # waits for the upgrade to commit
        search.commit()
        upgrading.join(timeout=60)
    assert errors == []
    from statekeep.db.migrations import current_version

    db = Database(postgres_url)
    assert current_version(db, "memory", q.SCHEMA) == len(q.MIGRATIONS)
    db.dispose()
