"""The SQL of the pgvector backend: schema, row-level security, and statement builders (pure).

The table is hash-partitioned by owner, so that erasing an owner rewrites one
partition (``VACUUM FULL``), not the whole store. Row-level security makes the
database itself refuse another owner's rows: every statement runs after
``set_config('statekeep.owner', <owner>, true)``, and the policy compares each
row's owner with that setting.
"""

from __future__ import annotations

import functools
import hashlib
import re

import sqlalchemy as sa
from sqlalchemy.engine import Connection

from statekeep.db import Migration
from statekeep.db.dialects import no_statistics
from statekeep.memory._dedupe import identity
from statekeep.memory.recall._irregular import sql_function

SCHEMA = "statekeep_memory"
TABLE = f"{SCHEMA}.memories"
#: How many of each owner's memories hold each word (a ``tsv`` lexeme); the word '' counts them all.
WORDS = f"{SCHEMA}.memory_words"
PARTITIONS = 16
OWNER_SETTING = "statekeep.owner"
#: The write order of memories (``seq``): search breaks ties by content, then by it.
SEQUENCE = f"{SCHEMA}.memory_seq"
#: HNSW build effort, below pgvector's default (64) for write throughput; searches use ef_search=100
#: and iterative scans to keep recall (bench/memory.py; figures in docs/memory.md, backends).
EF_CONSTRUCTION = 32
#: Columns whose values could identify an owner's data are never sampled by ANALYZE,
#: so no copy of them lands in pg_statistic, which erasure does not rewrite.
PRIVATE_COLUMNS = ("owner", "id", "content", "tags", "metadata", "session_id", "run_id", "event_id",
                   "superseded_by", "duplicate_of", "tsv", "embedding")  # fmt: skip

SELECT_COLUMNS = (
    "id, owner, content, kind, tags, metadata, source, session_id, run_id, event_id, trust, model, "
    "created_us, expires_us, superseded_by, duplicate_of, key, dedupe_key, duplicate_score, seq"
)
_INTO = f"INSERT INTO {TABLE} ({SELECT_COLUMNS.removesuffix(', seq')}, embedding, sentences)"
_VALUES = (
    ":id, :owner, :content, :kind, :tags, CAST(:metadata AS jsonb), :source, :session_id, :run_id, "
    ":event_id, :trust, :model, :created_us, :expires_us, :superseded_by, :duplicate_of, :key, :dedupe_key, "
    ":duplicate_score, :embedding, CAST(:sentences AS vector[])"
)
#: A memory that dedupes its identity with ``:dedupe_key``: not superseded, not expired at ``:now_us``.
_CURRENT = "superseded_by IS NULL AND (expires_us IS NULL OR expires_us > :now_us)"
#: One memory in; its write order (``seq``) is the column's default. ``:embedding`` is sent in
#: pgvector's binary format (a numpy array through pgvector's psycopg dumper), ``:sentences`` (a
#: list of them, or None) as an array of vectors.
INSERT = f"{_INTO} VALUES ({_VALUES})"
#: One memory in, unless the owner has a current memory of its identity by now. After
#: ``LOCK_IDENTITIES`` in a READ COMMITTED transaction, the check sees what every concurrent
#: writer of the identity committed: the one holding the lock before finished first.
INSERT_UNLESS_SAME = (
    f"{_INTO} SELECT {_VALUES} WHERE NOT EXISTS "
    f"(SELECT 1 FROM {TABLE} WHERE owner = :owner AND dedupe_key = :dedupe_key AND {_CURRENT})"
)
#: Transaction-scoped locks on (owner, identity) pairs (:func:`identity_lock`), taken in the order given.
LOCK_IDENTITIES = "SELECT pg_advisory_xact_lock(k) FROM unnest(CAST(:keys AS bigint[])) AS k"
#: The write order of memories just inserted.
SEQS = f"SELECT id, seq FROM {TABLE} WHERE owner = :owner AND id = ANY(:ids)"
#: The transactions of ``Pipeline.run`` (:mod:`._pipeline`), as ``Database.read`` and ``begin`` open them.
BEGIN_READ = "BEGIN ISOLATION LEVEL REPEATABLE READ READ ONLY"
#: Each statement of a write sees what was committed before it began (INSERT_UNLESS_SAME relies on it).
BEGIN_WRITE = "BEGIN ISOLATION LEVEL READ COMMITTED"
#: Mark a memory superseded by its successor.
MARK = f"UPDATE {TABLE} SET superseded_by = :s WHERE owner = :owner AND id = :id"
#: One memory in, superseding ``:supersedes``, only if that one was current: the mark and the insert
#: are one statement, and a concurrent superseder waits on the row, then finds it marked (no insert).
INSERT_SUPERSEDING = (
    f"WITH marked AS (UPDATE {TABLE} SET superseded_by = :id WHERE owner = :owner AND id = :supersedes "
    f"AND superseded_by IS NULL RETURNING id) {_INTO} SELECT {_VALUES} WHERE EXISTS (SELECT 1 FROM marked)"
)
#: The owner's unexpired, not superseded memories with one of the identities, oldest first.
SAME = (
    f"SELECT {SELECT_COLUMNS} FROM {TABLE} WHERE owner = :owner AND dedupe_key = ANY(:keys) "
    f"AND {_CURRENT} ORDER BY seq"
)
#: The order of results among equal scores: content by code point (as Python compares), then write order.
TIES = 'content COLLATE "C", seq'

POLICY = f"owner = current_setting('{OWNER_SETTING}', true)"


def _create(conn: Connection) -> None:
    conn.exec_driver_sql(
        f"""CREATE TABLE {TABLE} (
            owner text NOT NULL, id text NOT NULL, content text NOT NULL, kind text NOT NULL,
            tags text[] NOT NULL DEFAULT '{{}}', metadata jsonb NOT NULL DEFAULT '{{}}',
            source text NOT NULL, session_id text, run_id text, event_id text,
            trust double precision NOT NULL, model text NOT NULL,
            created_us bigint NOT NULL, expires_us bigint, superseded_by text, duplicate_of text,
            embedding vector NOT NULL,
            tsv tsvector GENERATED ALWAYS AS (to_tsvector('english', content)) STORED,
            PRIMARY KEY (owner, id)
        ) PARTITION BY HASH (owner)"""
    )
    _partition(conn, TABLE)
    conn.exec_driver_sql(f"CREATE INDEX memories_tsv ON {TABLE} USING gin (tsv)")
    conn.exec_driver_sql(f"CREATE INDEX memories_expiry ON {TABLE} (expires_us) WHERE expires_us IS NOT NULL")
    conn.exec_driver_sql(f"CREATE INDEX memories_model ON {TABLE} (model)")
    no_statistics(conn, SCHEMA, {"memories": PRIVATE_COLUMNS})


def partitions(table: str) -> list[str]:
    """The hash partitions of ``TABLE`` or ``WORDS``: partition i of both holds the same owners."""
    return [f"{table}_p{i}" for i in range(PARTITIONS)]


def _partition(conn: Connection, table: str) -> None:
    """Create the hash partitions of ``table`` by owner, each under row-level security like the table."""
    for i, part in enumerate(partitions(table)):
        conn.exec_driver_sql(
            f"CREATE TABLE {part} PARTITION OF {table} FOR VALUES WITH (MODULUS {PARTITIONS}, REMAINDER {i})"
        )
        _secure(conn, part)
    _secure(conn, table)


def _secure(conn: Connection, table: str) -> None:
    conn.exec_driver_sql(f"ALTER TABLE {table} ENABLE ROW LEVEL SECURITY")
    conn.exec_driver_sql(f"CREATE POLICY owner_scope ON {table} USING ({POLICY}) WITH CHECK ({POLICY})")


def _dedupe_and_order(conn: Connection) -> None:
    """Identity (caller's key or normalised text), merge score, and write order of each memory."""
    conn.exec_driver_sql(f"CREATE SEQUENCE {SEQUENCE} AS bigint")
    conn.exec_driver_sql(
        f"ALTER TABLE {TABLE} ADD COLUMN key text, ADD COLUMN dedupe_key text, "
        "ADD COLUMN duplicate_score double precision, ADD COLUMN seq bigint"
    )
    # existing memories: their identity from their text, their order from creation (then id)
    rows = conn.execute(sa.text(f"SELECT owner, id, content FROM {TABLE} ORDER BY created_us, id")).all()
    if rows:
        conn.execute(
            sa.text(
                f"UPDATE {TABLE} SET seq = nextval('{SEQUENCE}'), dedupe_key = :k "
                "WHERE owner = :o AND id = :i"
            ),
            [{"k": identity(r.content, None), "o": r.owner, "i": r.id} for r in rows],
        )
    conn.exec_driver_sql(
        f"ALTER TABLE {TABLE} ALTER COLUMN seq SET DEFAULT nextval('{SEQUENCE}'), "
        "ALTER COLUMN seq SET NOT NULL"
    )
    conn.exec_driver_sql(f"CREATE INDEX memories_dedupe ON {TABLE} (owner, dedupe_key)")
    no_statistics(conn, SCHEMA, {"memories": ("key", "dedupe_key")})


#: Every column of an index expression in the memory schema (the HNSW indexes, partitions' included):
#: ANALYZE samples them like table columns, so statistics are switched off on each.
EXPRESSION_COLUMNS = f"""SELECT CAST(CAST(ic.oid AS regclass) AS text) AS rel, ic.relname AS name,
    a.attnum, a.attname, i.indrelid
  FROM pg_index i JOIN pg_class ic ON ic.oid = i.indexrelid
  JOIN pg_attribute a ON a.attrelid = i.indexrelid AND a.attnum > 0
  WHERE ic.relnamespace = CAST('{SCHEMA}' AS regnamespace) AND i.indexprs IS NOT NULL"""


def statistics_off(conn: Connection) -> None:
    """``SET STATISTICS 0`` on every index expression of the memory schema (idempotent)."""
    for row in conn.execute(sa.text(EXPRESSION_COLUMNS)).all():
        conn.exec_driver_sql(f"ALTER INDEX {row.rel} ALTER COLUMN {int(row.attnum)} SET STATISTICS 0")


def clear_statistics(conn: Connection, partition: str | None = None) -> None:
    """Delete what pg_statistic sampled of index expressions (of one partition's indexes, or all).

    Statistics are off on them, so only a database analyzed before that holds
    such rows; ``pg_clear_attribute_stats`` (PostgreSQL 18) removes them.
    """
    if conn.execute(sa.text("SELECT to_regproc('pg_clear_attribute_stats')")).scalar() is None:
        return  # PostgreSQL < 18: nothing to call (docs/privacy.md says so)
    sql = EXPRESSION_COLUMNS
    params: dict[str, object] = {}
    if partition is not None:
        sql += " AND i.indrelid = CAST(:part AS regclass)"
        params["part"] = partition
    for row in conn.execute(sa.text(sql), params).all():
        for inherited in (False, True):
            conn.execute(
                sa.text("SELECT pg_clear_attribute_stats(:s, :r, :a, :i)"),
                {"s": SCHEMA, "r": row.name, "a": row.attname, "i": inherited},
            )


def _no_expression_statistics(conn: Connection) -> None:
    statistics_off(conn)
    clear_statistics(conn)


#: The full-text index's pending list (kB): recent writes wait there, unsorted, until a vacuum or this size
#: moves them into the index, and every search reads all of it, once for each word it counts.
GIN_PENDING_KB = 64


def _short_pending_list(conn: Connection) -> None:
    """Each partition's full-text index keeps at most ``GIN_PENDING_KB`` of pending entries; flush them now.

    With PostgreSQL's default (4 MB), a search right after a bulk write is slow until autovacuum
    comes by (figures in docs/memory.md, backends).
    """
    of_each = (
        "SELECT CAST(CAST(inhrelid AS regclass) AS text) FROM pg_inherits "
        "WHERE inhparent = CAST(:i AS regclass)"
    )
    for index in conn.execute(sa.text(of_each), {"i": f"{SCHEMA}.memories_tsv"}).scalars().all():
        conn.exec_driver_sql(f"ALTER INDEX {index} SET (gin_pending_list_limit = {GIN_PENDING_KB})")
        conn.execute(sa.text("SELECT gin_clean_pending_list(CAST(:i AS regclass))"), {"i": index})


#: Each word of a memory (its text vector's lexemes), and '' for the memory itself.
_WORDS_OF = "unnest(tsvector_to_array(tsv) || CAST('{\"\"}' AS text[])) AS word"


def _count(rows: str, sign: str) -> str:
    """Add the words of the memories ``rows`` (a FROM item with ``owner`` and ``tsv``) to their owners'
    counts (``sign`` '') or take them away ('-'). Rows are updated in (owner, word) order, so an
    owner's row of word '' comes first: it stays locked until the transaction ends, and two writers
    of one owner take turns instead of waiting on each other's word rows in a cycle (a deadlock)."""
    return (
        f"INSERT INTO {WORDS} AS w (owner, word, memories) SELECT owner, word, {sign}count(*) "
        f"FROM (SELECT owner, {_WORDS_OF} FROM {rows}) AS s GROUP BY owner, word ORDER BY owner, word "
        "ON CONFLICT (owner, word) DO UPDATE SET memories = w.memories + excluded.memories"
    )


#: Count the words of the memories a write just inserted (``:ids`` of ``:owner``; those not inserted
#: are not found). One statement at the end of the write's transaction, not a trigger on each
#: insert: a batch inserted row by row would update an owner's frequent words once per memory.
COUNT_WRITTEN = _count(f"(SELECT owner, tsv FROM {TABLE} WHERE owner = :owner AND id = ANY(:ids)) AS m", "")
#: Whatever deletes memories (erasure, expiry, an operator's DELETE), this trigger's function takes
#: their words away, once per statement, and drops the rows of words no memory holds any more.
_COUNT_REMOVED = f"""CREATE FUNCTION {SCHEMA}.count_removed_words() RETURNS trigger LANGUAGE plpgsql AS $fn$
BEGIN
  {_count("removed", "-")};
  DELETE FROM {WORDS} AS w USING (SELECT DISTINCT owner, {_WORDS_OF} FROM removed) AS r
    WHERE w.owner = r.owner AND w.word = r.word AND w.memories <= 0;
  RETURN NULL;
END
$fn$"""


def _count_words(conn: Connection) -> None:
    """Each owner's count of memories per word: writes add to it (``COUNT_WRITTEN``), deletes take away.

    Full-text search leaves out the query's common words (:func:`text_sql`), and counting
    them in the memories took a third of its time. The text vectors stay in the row
    (``STORAGE MAIN``): ranking reads each one, and one moved to TOAST cost two more index
    and page reads each time.
    """
    conn.exec_driver_sql(f"ALTER TABLE {TABLE} ALTER COLUMN tsv SET STORAGE MAIN")
    conn.exec_driver_sql(
        f"CREATE TABLE {WORDS} (owner text NOT NULL, word text NOT NULL, memories integer NOT NULL, "
        "PRIMARY KEY (owner, word)) PARTITION BY HASH (owner)"
    )
    _partition(conn, WORDS)  # the same partitions as the memories: erasing an owner rewrites one of each
    # an owner's count of memories would be a sample too
    no_statistics(conn, SCHEMA, {"memory_words": ("owner", "word", "memories")})
    conn.exec_driver_sql(RECOUNT)
    _grant_like_memories(conn)
    conn.exec_driver_sql(_COUNT_REMOVED)
    conn.exec_driver_sql(
        f"CREATE TRIGGER count_removed_words AFTER DELETE ON {TABLE} REFERENCING OLD TABLE AS removed "
        f"FOR EACH STATEMENT EXECUTE FUNCTION {SCHEMA}.count_removed_words()"
    )
    conn.exec_driver_sql(_TRUNCATE_WORDS)
    conn.exec_driver_sql(
        f"CREATE TRIGGER truncate_words AFTER TRUNCATE ON {TABLE} "
        f"FOR EACH STATEMENT EXECUTE FUNCTION {SCHEMA}.truncate_words()"
    )


#: Every owner's counts from the memories themselves (``WORDS`` empty before: migration 5, or a recount).
RECOUNT = (
    f"INSERT INTO {WORDS} (owner, word, memories) SELECT owner, word, count(*) "
    f"FROM (SELECT owner, {_WORDS_OF} FROM {TABLE}) AS s GROUP BY owner, word"
)
#: The memories emptied by ``TRUNCATE`` (no row trigger fires): their words go too, and their files.
_TRUNCATE_WORDS = f"""CREATE FUNCTION {SCHEMA}.truncate_words() RETURNS trigger LANGUAGE plpgsql AS $fn$
BEGIN
  TRUNCATE {WORDS};
  RETURN NULL;
END
$fn$"""


#: The roles given privileges on a table (its owner's own left out), and whether one holds ``what``.
#: A regrole's text is already quoted where the name needs it (quote_ident on it names another role).
_GRANTEES = """SELECT CAST(CAST(a.grantee AS regrole) AS text) AS role,
    bool_or(a.privilege_type = :what) AS holds
  FROM pg_class c, aclexplode(c.relacl) AS a
  WHERE c.oid = CAST(:t AS regclass) AND a.grantee NOT IN (0, c.relowner) GROUP BY a.grantee"""


def _grant_like_memories(conn: Connection) -> None:
    """Give each worker role that ``grant`` let use the memories the same use of ``WORDS``, so that
    workers keep working through the upgrade (searches read it, writes and erasure change it)."""
    for what, privileges in (("SELECT", "SELECT"), ("INSERT", "INSERT, UPDATE, DELETE")):
        for role in conn.execute(sa.text(_GRANTEES), {"t": TABLE, "what": what}).all():
            if role.holds:  # a reader searches (reads the counts); a writer also changes them
                conn.exec_driver_sql(f"GRANT {privileges} ON {WORDS} TO {role.role}")
    params = {"t": partitions(TABLE)[0], "what": "MAINTAIN"}  # erasure's VACUUM FULL (PostgreSQL 17+)
    for role in conn.execute(sa.text(_GRANTEES), params).all():
        if role.holds:
            conn.exec_driver_sql(f"GRANT MAINTAIN ON {', '.join(partitions(WORDS))} TO {role.role}")


def _sentences(conn: Connection) -> None:
    """A vector per sentence of a short memory (:mod:`._sentences`), null for the memories written before."""
    conn.exec_driver_sql(f"ALTER TABLE {TABLE} ADD COLUMN sentences vector[]")
    no_statistics(conn, SCHEMA, {"memories": ("sentences",)})


#: A memory's text vector: its words (English stemming, stop words dropped) and the base forms of its
#: irregular forms ("went" holds "go" too: :mod:`._irregular`); the query's forms are read as bases.
IRREGULAR_BASES = f"{SCHEMA}.irregular_bases(text)"
TEXT_VECTOR = f"to_tsvector('english', content) || to_tsvector('english', {SCHEMA}.irregular_bases(content))"


def _irregular_bases(conn: Connection) -> None:
    """The text vector again, with the bases of irregular forms (:data:`TEXT_VECTOR`); the counts redone.

    The column is dropped and added again (PostgreSQL before 17 cannot change a generated
    column's expression), which rewrites the table under an exclusive lock: the upgrade
    waits for the writes under way, and the words' counts are taken again after it. The
    column's storage and statistics are set in the statement that adds it, so the rows
    rewritten keep their text vectors in the row (migration 5). The counts are deleted,
    not truncated: a search holds the counts before it asks for the memories, and
    ``TRUNCATE`` would wait for it while it waits for the upgrade (a deadlock). Worker
    roles that may write the memories may call the function their inserts compute.
    """
    conn.exec_driver_sql(sql_function(SCHEMA))
    conn.exec_driver_sql(f"ALTER TABLE {TABLE} DROP COLUMN tsv")  # its index goes with it
    conn.exec_driver_sql(
        f"ALTER TABLE {TABLE} ADD COLUMN tsv tsvector GENERATED ALWAYS AS ({TEXT_VECTOR}) STORED, "
        "ALTER COLUMN tsv SET STORAGE MAIN, ALTER COLUMN tsv SET STATISTICS 0"
    )
    conn.exec_driver_sql(f"CREATE INDEX memories_tsv ON {TABLE} USING gin (tsv)")
    _short_pending_list(conn)
    conn.exec_driver_sql(f"DELETE FROM {WORDS}")
    conn.exec_driver_sql(RECOUNT)
    for role in conn.execute(sa.text(_GRANTEES), {"t": TABLE, "what": "INSERT"}).all():
        if role.holds:
            conn.exec_driver_sql(f"GRANT EXECUTE ON FUNCTION {IRREGULAR_BASES} TO {role.role}")


def _sessions(conn: Connection) -> None:
    """Each owner's memories by session in write order: hybrid search asks which of its candidates
    opens its session (:data:`FIRST_WRITES`), one index probe per session."""
    conn.exec_driver_sql(
        f"CREATE INDEX memories_session ON {TABLE} (owner, session_id, seq) WHERE session_id IS NOT NULL"
    )


#: The first write (``seq``) of each of the owner's sessions ``:sessions``, current memories or not
#: (null for a session of none).
FIRST_WRITES = (
    "SELECT s.session_id, (SELECT min(m.seq) FROM "
    + TABLE
    + " AS m WHERE m.owner = :owner AND m.session_id = s.session_id) AS seq"
    " FROM unnest(CAST(:sessions AS text[])) AS s(session_id)"
)


MIGRATIONS = [
    Migration(1, "memories, partitioned by owner, with row-level security", _create),
    Migration(2, "deduplication by identity, and a write order that breaks ranking ties", _dedupe_and_order),
    Migration(3, "no statistics on index expressions (embeddings)", _no_expression_statistics),
    Migration(
        4,
        "a short pending list in the full-text index (searches count words through it)",
        _short_pending_list,
    ),
    Migration(
        5,
        "each owner's count of memories per word; text vectors kept in the row",
        _count_words,
    ),
    Migration(6, "sentence vectors of short memories", _sentences),
    Migration(7, "irregular forms read as their base form by full-text search", _irregular_bases),
    Migration(8, "memories by session in write order (the first of each session)", _sessions),
]


#: The partitions of ``:tables`` that the current role may not vacuum or analyze: PostgreSQL 17
#: grants that as ``MAINTAIN``; before, only the table's owner (or a member of its role) may.
NOT_MAINTAINABLE = """SELECT CAST(CAST(i.inhrelid AS regclass) AS text) FROM pg_inherits AS i
  JOIN pg_class AS c ON c.oid = i.inhrelid
  WHERE i.inhparent = ANY(CAST(CAST(:tables AS text[]) AS regclass[]))
  AND NOT CASE WHEN current_setting('server_version_num')::int >= 170000
    THEN has_table_privilege(i.inhrelid, 'MAINTAIN') ELSE pg_has_role(c.relowner, 'USAGE') END"""
#: How many memories an owner has (every one: current or not), kept by migration 5's word counts.
OWNER_SIZE = f"SELECT coalesce((SELECT memories FROM {WORDS} WHERE owner = :owner AND word = ''), 0) AS count"


_PARAM = re.compile(r"(?<![:\w]):([A-Za-z_]\w*)")
_LITERAL = re.compile(r"('(?:[^']|'')*')")
_VECTORS = re.compile(r"CAST\(%\((\w+)\)s AS vector\[\]\)")


@functools.lru_cache(maxsize=512)
def pyformat(sql: str) -> str:
    """A statement written with ``:name`` parameters in psycopg's ``%(name)s`` style.

    Quoted literals are kept as they are, ``::`` casts too; every ``%`` is doubled. An
    array of vectors (``CAST(:name AS vector[])``) is sent in binary (``%(name)b``): psycopg
    would send its elements as text otherwise, where one vector goes out in binary by itself.

    Examples:
        >>> pyformat("SELECT a::text FROM t WHERE m = 'x :y' AND o = :owner")
        "SELECT a::text FROM t WHERE m = 'x :y' AND o = %(owner)s"
        >>> pyformat("SELECT CAST(:v AS vector), CAST(:vs AS vector[])")
        'SELECT CAST(%(v)s AS vector), CAST(%(vs)b AS vector[])'
    """
    parts = _LITERAL.split(sql.replace("%", "%%"))
    out = "".join(p if i % 2 else _PARAM.sub(r"%(\1)s", p) for i, p in enumerate(parts))
    return _VECTORS.sub(r"CAST(%(\1)b AS vector[])", out)


@functools.lru_cache(maxsize=64)
def settings_sql(names: tuple[str, ...]) -> str:
    """One statement that sets each named setting for the rest of the transaction (``%(s<i>)s`` values)."""
    calls = ", ".join(f"set_config({literal(n)}, %(s{i})s, true)" for i, n in enumerate(names))
    return f"SELECT {calls}"


def literal(value: str) -> str:
    """A SQL string literal (standard_conforming_strings: only quotes are special)."""
    if "\x00" in value:
        raise ValueError("NUL in a SQL literal")
    return "'" + value.replace("'", "''") + "'"


def identity_lock(owner: str, dedupe_key: str) -> int:
    """The advisory lock key (a signed 64-bit integer) of one identity of one owner."""
    digest = hashlib.sha256(f"statekeep-memory\x00{owner}\x00{dedupe_key}".encode()).digest()
    return int.from_bytes(digest[:8], "big", signed=True)


def vector_expr(dimension: int) -> str:
    """The indexed expression: the untyped column cast to this model's dimension."""
    return f"(embedding::vector({int(dimension)}))"


def index_ddl(model: str, dimension: int) -> tuple[str, str]:
    """A partial HNSW index over one model's vectors (any number of models can coexist): (name, DDL)."""
    name = "memories_hnsw_" + hashlib.sha256(f"{model}/{dimension}".encode()).hexdigest()[:16]
    return name, (
        f"CREATE INDEX IF NOT EXISTS {name} ON {TABLE} USING hnsw "
        f"({vector_expr(dimension)} vector_cosine_ops) WITH (m = 16, ef_construction = {EF_CONSTRUCTION}) "
        f"WHERE model = {literal(model)}"
    )


def words_partition(partition: str) -> str:
    """The partition of ``WORDS`` that holds the word counts of the owners of a memory partition.

    By its number: a partition's name from ``regclass`` lacks the schema when that is on the search path.

    Examples:
        >>> words_partition("statekeep_memory.memories_p3"), words_partition("memories_p12")
        ('statekeep_memory.memory_words_p3', 'statekeep_memory.memory_words_p12')
    """
    return partitions(WORDS)[int(partition.rsplit("_p", 1)[1])]


def partition_of(conn: Connection, owner: str) -> str:
    """The partition of the memories that holds (or would hold) an owner's rows."""
    for i, part in enumerate(partitions(TABLE)):
        row = conn.execute(
            sa.text("SELECT satisfies_hash_partition(CAST(:parent AS regclass), :m, :r, CAST(:o AS text))"),
            {"parent": TABLE, "m": PARTITIONS, "r": i, "o": owner},
        ).scalar_one()
        if row:
            return part
    raise AssertionError("hash partitions cover every owner")  # pragma: no cover
