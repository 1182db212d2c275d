"""The SQL of the pgvector backend: schema, row-level security, and statement builders (pure).

The table is hash-partitioned by owner, so that erasing an owner rewrites one
partition (``VACUUM FULL``), not the whole store. Row-level security makes the
database itself refuse another owner's rows: every statement runs after
``set_config('statekeep.owner', <owner>, true)``, and the policy compares each
row's owner with that setting.
"""

from __future__ import annotations

import hashlib

import sqlalchemy as sa
from sqlalchemy.engine import Connection

from statekeep.db import Migration
from statekeep.memory._rows import to_us
from statekeep.memory._types import Filters

SCHEMA = "statekeep_memory"
TABLE = f"{SCHEMA}.memories"
PARTITIONS = 16
OWNER_SETTING = "statekeep.owner"
#: HNSW build effort: 32 (pgvector's default is 64) doubles write throughput; searches use
#: ef_search=100 and iterative scans, which keep recall@10 above 0.95 (see bench/memory.py).
EF_CONSTRUCTION = 32
#: Columns whose values could identify an owner's data are never sampled by ANALYZE,
#: so no copy of them lands in pg_statistic, which erasure does not rewrite.
PRIVATE_COLUMNS = ("owner", "id", "content", "tags", "metadata", "session_id", "run_id", "event_id",
                   "superseded_by", "duplicate_of", "tsv", "embedding")  # fmt: skip

SELECT_COLUMNS = (
    "id, owner, content, kind, tags, metadata, source, session_id, run_id, event_id, trust, model, "
    "created_us, expires_us, superseded_by, duplicate_of"
)
INSERT = sa.text(
    f"INSERT INTO {TABLE} ({SELECT_COLUMNS}, embedding) VALUES (:id, :owner, :content, :kind, :tags, "
    "CAST(:metadata AS jsonb), :source, :session_id, :run_id, :event_id, :trust, :model, :created_us, "
    ":expires_us, :superseded_by, :duplicate_of, CAST(:embedding AS vector))"
)
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
    for i in range(PARTITIONS):
        part = f"{TABLE}_p{i}"
        conn.exec_driver_sql(
            f"CREATE TABLE {part} PARTITION OF {TABLE} FOR VALUES WITH (MODULUS {PARTITIONS}, REMAINDER {i})"
        )
        _secure(conn, part)
    _secure(conn, TABLE)
    conn.exec_driver_sql(f"CREATE INDEX memories_tsv ON {TABLE} USING gin (tsv)")
    conn.exec_driver_sql(f"CREATE INDEX memories_expiry ON {TABLE} (expires_us) WHERE expires_us IS NOT NULL")
    conn.exec_driver_sql(f"CREATE INDEX memories_model ON {TABLE} (model)")
    for column in PRIVATE_COLUMNS:
        conn.exec_driver_sql(f"ALTER TABLE {TABLE} ALTER COLUMN {column} SET STATISTICS 0")


def _secure(conn: Connection, table: str) -> None:
    conn.exec_driver_sql(f"ALTER TABLE {table} ENABLE ROW LEVEL SECURITY")
    conn.exec_driver_sql(f"CREATE POLICY owner_scope ON {table} USING ({POLICY}) WITH CHECK ({POLICY})")


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


MIGRATIONS = [
    Migration(1, "memories, partitioned by owner, with row-level security", _create),
    Migration(2, "no statistics on index expressions (embeddings)", _no_expression_statistics),
]


#: How many memories an owner has, counting no further than ``:n`` (an index-only scan).
BOUNDED_COUNT = f"SELECT count(*) FROM (SELECT 1 FROM {TABLE} WHERE owner = :owner LIMIT :n) AS s"


def literal(value: str) -> str:
    """A SQL string literal (standard_conforming_strings: only quotes are special)."""
    if "\x00" in value:
        raise ValueError("NUL in a SQL literal")
    return "'" + value.replace("'", "''") + "'"


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


def scope_where(now_us: int | None, filters: Filters | None) -> tuple[str, dict[str, object]]:
    """The WHERE clause (after ``owner = :owner``) and its parameters for a scoped search."""
    parts = ["owner = :owner"]
    params: dict[str, object] = {}
    if now_us is not None:
        parts.append("superseded_by IS NULL AND duplicate_of IS NULL")
        parts.append("(expires_us IS NULL OR expires_us > :now_us)")
        params["now_us"] = now_us
    if filters is not None:
        parts.extend(_filter_parts(filters, params))
    return " AND ".join(parts), params


def _filter_parts(f: Filters, params: dict[str, object]) -> list[str]:
    parts = []
    if f.kinds:
        parts.append("kind = ANY(:kinds)")
        params["kinds"] = list(f.kinds)
    if f.tags:
        parts.append("tags @> CAST(:tags AS text[])")
        params["tags"] = list(f.tags)
    if f.since is not None:
        parts.append("created_us >= :since_us")
        params["since_us"] = to_us(f.since)
    if f.until is not None:
        parts.append("created_us < :until_us")
        params["until_us"] = to_us(f.until)
    if f.sources:
        parts.append("source = ANY(:sources)")
        params["sources"] = list(f.sources)
    if f.min_trust is not None:
        parts.append("trust >= :min_trust")
        params["min_trust"] = f.min_trust
    return parts


def nearest_sql(model: str, dimension: int, clause: str) -> str:
    """Nearest-neighbour search in one model's partial index (the model inlined to match it)."""
    expr = vector_expr(dimension)
    return (
        f"SELECT {SELECT_COLUMNS}, {expr} <=> CAST(:q AS vector({int(dimension)})) AS distance "
        f"FROM {TABLE} WHERE {clause} AND model = {literal(model)} ORDER BY distance LIMIT :k"
    )


def nearest_each_sql(model: str, dimension: int, clause: str) -> str:
    """The nearest current memory to each of many vectors, in one round trip (for duplicate checks)."""
    expr, dim = vector_expr(dimension), int(dimension)
    # materialized, so each query vector is parsed once, not once per candidate row
    return (
        f"WITH q AS MATERIALIZED (SELECT i, CAST(v AS vector({dim})) AS v "
        f"FROM unnest(CAST(:vs AS text[])) WITH ORDINALITY AS u(v, i)) "
        f"SELECT q.i, m.* FROM q CROSS JOIN LATERAL (SELECT {SELECT_COLUMNS}, {expr} <=> q.v AS distance "
        f"FROM {TABLE} WHERE {clause} AND model = {literal(model)} ORDER BY distance LIMIT 1) AS m"
    )


def text_sql(clause: str) -> str:
    """Full-text search: any word of the query matches, ranked by ``ts_rank_cd``."""
    return (
        f"SELECT {SELECT_COLUMNS}, ts_rank_cd(tsv, q) AS rank FROM {TABLE}, "
        "CAST(replace(CAST(plainto_tsquery('english', :query) AS text), '&', '|') AS tsquery) AS q "
        f"WHERE {clause} AND tsv @@ q ORDER BY rank DESC, id LIMIT :k"
    )


def partition_of(conn: Connection, owner: str) -> str:
    """The partition that holds (or would hold) an owner's rows."""
    for i in range(PARTITIONS):
        row = conn.execute(
            sa.text("SELECT satisfies_hash_partition(CAST(:parent AS regclass), :m, :r, CAST(:o AS text))"),
            {"parent": TABLE, "m": PARTITIONS, "r": i, "o": owner},
        ).scalar_one()
        if row:
            return f"{TABLE}_p{i}"
    raise AssertionError("hash partitions cover every owner")  # pragma: no cover
