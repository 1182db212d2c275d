"""The pgvector backend: memories in PostgreSQL, shared safely by many workers on many machines.

* Scoping is enforced twice: every statement filters by owner, and row-level
  security refuses any row whose owner is not the transaction's
  ``statekeep.owner`` setting (for every role that is not the table's owner,
  a superuser or ``BYPASSRLS``; run workers as such a role, see :meth:`grant`).
* Filtered search uses HNSW with iterative index scans (``hnsw.iterative_scan``),
  so a small owner in a big table still gets ``k`` results.
* Erasure deletes the rows, then ``VACUUM FULL`` rewrites the owner's partition:
  heap, TOAST and every index are written anew, so no freed page still holds
  the deleted bytes (a plain ``VACUUM`` only marks them free). It first waits
  for the transactions older than the delete, which would keep the deleted rows
  (:mod:`statekeep.db.rewrite`). Statistics are
  off on every column and index expression that holds memory content, and
  erasure clears whatever pg_statistic sampled of the partition's indexes.
* One round trip per call: a search's transaction (its owner setting and search
  settings, the query; the pipeline's sync ends it) goes out in one psycopg
  pipeline, and vectors travel in pgvector's binary format, not as text.
"""

from __future__ import annotations

import functools
from contextlib import AbstractContextManager, nullcontext
from dataclasses import replace
from datetime import datetime
from typing import Any

import numpy as np
import psycopg
import sqlalchemy as sa
from sqlalchemy.engine import Connection

import statekeep.memory.pgvector._search as ps
import statekeep.memory.pgvector._sql as q
from statekeep._check import check_int
from statekeep.db import Database, upgrade
from statekeep.db.engine import storage_error
from statekeep.db.migrations import current_version
from statekeep.db.rewrite import MARK, rewrite
from statekeep.errors import ConfigError, StorageError
from statekeep.memory._backend import Capability
from statekeep.memory._rows import from_row, to_row, to_us
from statekeep.memory._types import Filters, Memory, SearchResult
from statekeep.memory.base import MemoryStore
from statekeep.memory.embedders import Embedder, Vectors
from statekeep.memory.pgvector._pipeline import Pipeline, Statement
from statekeep.memory.recall._irregular import base_forms
from statekeep.memory.recall._ranking import rank_key, top_k
from statekeep.memory.recall._sentences import Parts

NOT_REACHED = (
    "PostgreSQL's write-ahead log (pg_wal) until its segments are recycled, and WAL archives",
    "physical and logical backups, replicas' lagging WAL, and dumps taken before the erasure",
)
#: Memories of a model (``:m``) never split into sentences, short enough to be (``:n`` characters).
_UNSPLIT = "model = :m AND sentences IS NULL AND char_length(content) <= :n"


class PgVectorMemoryStore(MemoryStore):
    """Memories in PostgreSQL with pgvector; the production backend for many workers.

    Examples:
        >>> store = PgVectorMemoryStore("postgresql://app@db/agent")  # doctest: +SKIP
        >>> store.remember("alice", "Alice prefers tea")  # doctest: +SKIP

    Args:
        db: a URL or a :class:`~statekeep.db.Database` (it may be shared with the other stores).
        embedder: defaults to all-MiniLM-L6-v2.
        ef_search: HNSW candidate list size; larger is slower and more exact.
        exact_below: an owner with fewer memories is searched exactly (complete, and fast at
            that size); a bigger one through the HNSW index with iterative scans.
    """

    backend = "pgvector"
    capabilities = frozenset(Capability)  # every one

    def __init__(
        self,
        db: Database | str,
        embedder: Embedder | None = None,
        *,
        ef_search: int = 100,
        exact_below: int = 5_000,
        **kw: Any,
    ) -> None:
        super().__init__(embedder, **kw)
        check_int(ef_search, "ef_search", minimum=1, maximum=1_000)
        check_int(exact_below, "exact_below")
        self.db = db if isinstance(db, Database) else Database(db, setting="STATEKEEP_MEMORY_URL")
        if not self.db.dialect.holds_pgvector:
            raise ConfigError(
                self.db.setting, str(self.db.url), "pgvector memory needs a PostgreSQL database"
            )
        self._pipe = Pipeline(self.db, int(ef_search), int(exact_below))
        try:
            # a worker role may lack CREATE: it only needs the schema to be current already
            if current_version(self.db, "memory", q.SCHEMA) != len(q.MIGRATIONS):
                upgrade(self.db, "memory", q.SCHEMA, q.MIGRATIONS)
        except (sa.exc.SQLAlchemyError, StorageError) as exc:
            raise storage_error(
                exc, "setting up the memory tables (is the vector extension installed?)"
            ) from exc
        self._indexed: set[tuple[str, int]] = set()
        self._ensure_index(self.embedder.name, self.embedder.dimension)

    @property
    def ef_search(self) -> int:
        """HNSW candidate list size of a search."""
        return self._pipe.ef_search

    @ef_search.setter
    def ef_search(self, value: int) -> None:
        self._pipe.ef_search = int(value)  # checked by the constructor; a later setting is the caller's

    @property
    def exact_below(self) -> int:
        """An owner with fewer memories is searched exactly; a bigger one through the HNSW index."""
        return self._pipe.exact_below

    @exact_below.setter
    def exact_below(self, value: int) -> None:
        self._pipe.exact_below = int(value)

    def _run(
        self, owner: str, statements: list[Statement], *, write: bool, search: bool = False
    ) -> list[list[dict[str, Any]]]:
        """The statements' rows, run in one transaction scoped to ``owner`` (:meth:`Pipeline.run`)."""
        return self._pipe.run(owner, statements, write=write, search=search)

    def _driver(self, conn: Connection) -> psycopg.Connection[Any]:
        """The psycopg connection under ``conn``, sending vectors in binary (:meth:`Pipeline.driver`)."""
        return self._pipe.driver(conn)

    def _is_big(self, owner: str) -> bool:
        """Whether the owner is searched through the HNSW index (:meth:`Pipeline.is_big`)."""
        return self._pipe.is_big(owner)

    def _ensure_index(self, model: str, dimension: int) -> None:
        if (model, dimension) in self._indexed:
            return
        name, ddl = q.index_ddl(model, dimension)
        with self.db.begin() as conn:
            exists = conn.execute(sa.text("SELECT to_regclass(:n)"), {"n": f"{q.SCHEMA}.{name}"}).scalar()
            if exists is None:
                self.db.dialect.lock(conn, f"statekeep-memory-index-{model}")
                conn.exec_driver_sql(ddl)
                q.statistics_off(conn)  # the new index's expression: never sampled into pg_statistic
        self._indexed.add((model, dimension))

    def grant(self, role: str) -> None:
        """Let ``role`` (a worker's login role) use the memory store, under row-level security.

        The role needs neither superuser nor ``BYPASSRLS``, and should have
        neither: then the database itself refuses another owner's rows.
        """
        ident = self.db.engine.dialect.identifier_preparer.quote(role)
        parts = q.partitions(q.TABLE) + q.partitions(q.WORDS)
        with self.db.begin() as conn:
            conn.exec_driver_sql(f"GRANT USAGE ON SCHEMA {q.SCHEMA} TO {ident}")
            conn.exec_driver_sql(f"GRANT SELECT ON {q.SCHEMA}.memory_migrations TO {ident}")
            conn.exec_driver_sql(f"GRANT SELECT, INSERT, UPDATE, DELETE ON {q.TABLE}, {q.WORDS} TO {ident}")
            conn.exec_driver_sql(f"GRANT USAGE ON SEQUENCE {q.SEQUENCE} TO {ident}")
            # every insert computes it (the text vector's irregular forms)
            conn.exec_driver_sql(f"GRANT EXECUTE ON FUNCTION {q.IRREGULAR_BASES} TO {ident}")
            conn.exec_driver_sql(f"GRANT MAINTAIN ON {', '.join(parts)} TO {ident}")

    def close(self) -> None:
        """Close pooled connections."""
        self.db.dispose()

    # --- writes ---------------------------------------------------------------------------

    def _insert(self, memories: list[Memory], vectors: Vectors, parts: Parts | None = None) -> list[Memory]:
        return [m for m in self._write_rows(memories, vectors, parts) if m is not None]

    def _writing(self) -> AbstractContextManager[object]:
        return nullcontext()  # writers of one fact take turns in the database (_insert_unless_same)

    def _stored_meanwhile(self, owner: str, identities: list[str], now: datetime) -> dict[str, Memory]:
        return {}  # no second look: _insert_unless_same checks again in the transaction that inserts

    def _insert_unless_same(
        self, memories: list[Memory], vectors: Vectors, now: datetime, parts: Parts | None = None
    ) -> list[Memory | None]:
        return self._write_rows(memories, vectors, parts, unless_same=now)

    def _write_rows(
        self,
        memories: list[Memory],
        vectors: Vectors,
        parts: Parts | None,
        *,
        supersedes: str | None = None,
        unless_same: datetime | None = None,
    ) -> list[Memory | None]:
        """Insert memories in one transaction (``unless_same``: those whose identity is not current then;
        ``supersedes``: the one memory, only if it could mark that one superseded)."""
        self._ensure_index(self.embedder.name, vectors.shape[1])
        owner = memories[0].owner
        each = parts or [None] * len(memories)
        rows = [
            {**to_row(m), "embedding": v, "sentences": None if p is None else list(p)}
            for m, v, p in zip(memories, vectors, each, strict=True)
        ]
        statements = [Statement(q.INSERT, rows, many=True)]
        if supersedes is not None:  # one memory: inserted only if the old one is marked by it
            statements = [Statement(q.INSERT_SUPERSEDING, {**rows[0], "supersedes": supersedes})]
        if unless_same is not None:  # concurrent writers of one identity take turns, each checking anew
            keys = sorted({q.identity_lock(owner, r["dedupe_key"]) for r in rows})
            now_us = to_us(unless_same)
            statements = [
                Statement(q.LOCK_IDENTITIES, {"keys": keys}),
                Statement(q.INSERT_UNLESS_SAME, [{**r, "now_us": now_us} for r in rows], many=True),
            ]
        ids = [m.id for m in memories]
        statements.append(Statement(q.COUNT_WRITTEN, {"owner": owner, "ids": ids}))
        # the write order the column's default gave (none for a memory not inserted)
        seqs_at = len(statements)
        statements.append(Statement(q.SEQS, {"owner": owner, "ids": ids}))
        seqs = {r["id"]: int(r["seq"]) for r in self._run(owner, statements, write=True)[seqs_at]}
        return [replace(m, seq=seqs[m.id]) if m.id in seqs else None for m in memories]

    def _insert_superseding(
        self, new: Memory, vectors: Vectors, old_id: str, parts: Parts | None = None
    ) -> Memory | None:
        return self._write_rows([new], vectors, parts, supersedes=old_id)[0]

    def _same(self, owner: str, identities: list[str], now: datetime) -> dict[str, Memory]:
        found: dict[str, Memory] = {}
        same = Statement(q.SAME, {"owner": owner, "keys": identities, "now_us": to_us(now)})
        for r in self._run(owner, [same], write=False)[0]:
            found.setdefault(r["dedupe_key"], from_row(r))
        return found

    def _mark_superseded(self, owner: str, memory_id: str, successor: str) -> None:
        self._run(owner, [Statement(q.MARK, {"s": successor, "owner": owner, "id": memory_id})], write=True)

    # --- reads ----------------------------------------------------------------------------

    def _nearest_statement(
        self,
        owner: str,
        vector: Vectors,
        n: int,
        filters: Filters,
        now: datetime,
        *,
        exact: bool,
        best: bool = False,
    ) -> Statement:
        clause, params = ps.scope_where(to_us(now), filters)
        sql = ps.nearest_sql(self.embedder.name, vector.shape[0], clause, exact=exact, best=best)
        return Statement(sql, {**params, "owner": owner, "q": vector, "k": n})

    def _text_statement(
        self, owner: str, query: str, k: int, filters: Filters, now: datetime, vector: Vectors | None = None
    ) -> Statement:
        """Full-text search; with the query's ``vector``, each row's best cosine too (``best``)."""
        clause, params = ps.scope_where(to_us(now), filters)
        best = None if vector is None else (self.embedder.name, vector.shape[0])
        values = {**params, "owner": owner, "query": base_forms(query), "k": k}  # "went" as "go", as stored
        return Statement(ps.text_sql(clause, best), values if vector is None else {**values, "q": vector})

    @staticmethod
    def _neighbours(rows: list[dict[str, Any]]) -> list[SearchResult]:
        found = [SearchResult(from_row(r), 1.0 - float(r["distance"])) for r in rows]
        # relaxed_order may return neighbours slightly out of order: sort them here
        return sorted(found, key=rank_key)

    def _nearest(
        self, owner: str, vector: Vectors, k: int, filters: Filters, now: datetime
    ) -> list[SearchResult]:
        exact = not self._is_big(owner)
        fetch = functools.partial(self._fetch_nearest, owner, vector, filters, now)
        # exact: one more than k, and more only if that one ties with the k-th (see ps.nearest_sql)
        return top_k(fetch, k) if exact else fetch(k, exact=False)

    def _fetch_nearest(
        self, owner: str, vector: Vectors, filters: Filters, now: datetime, n: int, *, exact: bool = True
    ) -> list[SearchResult]:
        statement = self._nearest_statement(owner, vector, n, filters, now, exact=exact)
        return self._neighbours(self._run(owner, [statement], write=False, search=True)[0])

    def _hybrid(
        self, owner: str, vector: Vectors, query: str, k: int, filters: Filters, now: datetime
    ) -> tuple[list[SearchResult], list[SearchResult]]:
        """Both rankings of a hybrid search, each row with its best cosine, in one transaction and one
        round trip (more if tied at the cut)."""
        exact = not self._is_big(owner)
        n = k + 1 if exact else k
        near = self._nearest_statement(owner, vector, n, filters, now, exact=exact, best=True)
        text = self._text_statement(owner, query, k, filters, now, vector)
        near_rows, text_rows = self._run(owner, [near, text], write=False, search=True)
        hits = self._neighbours(near_rows)
        if exact:
            fetch = functools.partial(self._fetch_nearest, owner, vector, filters, now)
            hits = top_k(fetch, k, first=hits)
        texts = [SearchResult(from_row(r), float(r["rank"])) for r in text_rows]
        best = {r["id"]: float(r["best"]) for r in (*near_rows, *text_rows) if r["best"] is not None}
        missing = [h.memory.id for h in hits if h.memory.id not in best]  # fetched again at a tie
        if missing:
            best |= self._cosines(owner, vector, missing)
        candidates = {h.memory.id: h.memory for h in (*hits, *texts)}
        return [SearchResult(m, best[i]) for i, m in candidates.items() if i in best], texts

    def _cosines(self, owner: str, vector: Vectors, ids: list[str]) -> dict[str, float]:
        sql = ps.cosines_sql(self.embedder.name, vector.shape[0])
        rows = self._run(owner, [Statement(sql, {"owner": owner, "q": vector, "ids": ids})], write=False)[0]
        return {r["id"]: float(r["best"]) for r in rows if r["best"] is not None}

    def _first_writes(self, owner: str, sessions: list[str]) -> dict[str, int]:
        rows = self._run(
            owner, [Statement(q.FIRST_WRITES, {"owner": owner, "sessions": sessions})], write=False
        )
        return {r["session_id"]: r["seq"] for r in rows[0] if r["seq"] is not None}

    def _nearest_each(self, owner: str, vectors: Vectors, now: datetime) -> list[SearchResult | None]:
        clause, params = ps.scope_where(to_us(now), None)
        sql = ps.nearest_each_sql(self.embedder.name, vectors.shape[1], clause)
        found: list[SearchResult | None] = [None] * len(vectors)
        statement = Statement(sql, {**params, "owner": owner, "vs": list(vectors)})
        for r in self._run(owner, [statement], write=False, search=True)[0]:
            found[int(r["i"]) - 1] = SearchResult(from_row(r), 1.0 - float(r["distance"]))
        return found

    def _text(self, owner: str, query: str, k: int, filters: Filters, now: datetime) -> list[SearchResult]:
        statement = self._text_statement(owner, query, k, filters, now)
        rows = self._run(owner, [statement], write=False, search=True)[0]
        return [SearchResult(from_row(r), float(r["rank"])) for r in rows]

    def _select(self, owner: str, extra: str, params: dict[str, Any]) -> list[Memory]:
        sql = f"SELECT {q.SELECT_COLUMNS} FROM {q.TABLE} WHERE owner = :owner {extra}"
        rows = self._run(owner, [Statement(sql, {**params, "owner": owner})], write=False)[0]
        return [from_row(r) for r in rows]

    def _get(self, owner: str, memory_id: str, now: datetime) -> Memory | None:
        extra = "AND id = :id AND (expires_us IS NULL OR expires_us > :now_us)"
        rows = self._select(owner, extra, {"id": memory_id, "now_us": to_us(now)})
        return rows[0] if rows else None

    def _list(self, owner: str, now: datetime) -> list[Memory]:
        return self._select(owner, "AND (expires_us IS NULL OR expires_us > :now_us)", {"now_us": to_us(now)})

    # --- erasure --------------------------------------------------------------------------

    def _erase(self, owner: str, ids: list[str] | None) -> tuple[list[str], list[str], list[str]]:
        only = "" if ids is None else "AND id = ANY(:ids)"
        with self._pipe.scoped(owner) as conn:
            partition = q.partition_of(conn, owner)
            deleted = conn.execute(
                sa.text(f"DELETE FROM {q.TABLE} WHERE owner = :owner {only} RETURNING id"),
                {"owner": owner, "ids": ids or []},
            )
            removed = [r.id for r in deleted]
            q.clear_statistics(conn, partition)
            mark = conn.exec_driver_sql(MARK).scalar_one()
        words = q.words_partition(partition)
        rewrite(self.db, [partition, words], mark=mark, owner=owner)
        self._pipe.forget_size(owner)
        locations = [
            f"{partition}: heap, TOAST and every index rewritten (VACUUM FULL)",
            f"{words}: the owner's count of memories per word, rewritten the same way",
            f"{partition}: no pg_statistic row of its index expressions",
        ]
        return removed, locations, list(NOT_REACHED)

    def _optimize(self, full: bool) -> None:
        """``VACUUM (ANALYZE)``: planner statistics and a visibility map for what was just written.

        Until autovacuum visits a freshly loaded table, the planner guesses its sizes, and
        reading an owner's part of an index also reads the heap, to learn what is visible.
        """
        command = f"VACUUM ({'FULL, ' if full else ''}ANALYZE) {q.TABLE}, {q.WORDS}"
        try:
            with self.db.read("checking that optimize may vacuum the memory tables") as conn:
                found = conn.execute(sa.text(q.NOT_MAINTAINABLE), {"tables": [q.TABLE, q.WORDS]})
                refused = sorted(found.scalars())
            if refused:  # PostgreSQL would skip them with a warning, and optimize would do nothing
                role = self.db.url.username or "this role"
                raise ConfigError(
                    self.db.setting,
                    str(self.db.url),
                    f"optimize() may not vacuum {', '.join(refused)} as {role!r}: run it as the tables' "
                    "owner, or have the owner call grant() for this role (PostgreSQL 17 or later)",
                )
            if full:
                self._recount()
            self._vacuum([command])
        except sa.exc.SQLAlchemyError as exc:
            raise storage_error(exc, f"optimizing the memories ({command})") from exc
        self._pipe.forget_size()

    def _recount(self) -> None:
        """Count every owner's words again from the memories, as the tables' owner (a confined role sees
        none): this repairs what was written around the store (by SQL, or by a store older than the
        counts) while writers wait; searches go on."""
        with self.db.begin("recounting the words of the memories") as conn:
            if self._confined(conn):
                return
            conn.exec_driver_sql(f"LOCK TABLE {q.TABLE}, {q.WORDS} IN SHARE ROW EXCLUSIVE MODE")
            conn.exec_driver_sql(f"DELETE FROM {q.WORDS}")
            conn.exec_driver_sql(q.RECOUNT)

    def _vacuum(self, commands: list[str]) -> None:
        """Run ``VACUUM`` commands, which cannot run inside a transaction, on a connection of their own."""
        with self.db.engine.connect().execution_options(isolation_level="AUTOCOMMIT") as conn:
            for command in commands:
                conn.exec_driver_sql(command)

    @staticmethod
    def _confined(conn: Connection) -> bool:
        """Whether row-level security confines this role (to the owner set, or to none)."""
        confined = conn.execute(sa.text("SELECT row_security_active(CAST(:t AS regclass))"), {"t": q.TABLE})
        return bool(confined.scalar())

    def _sees_every_owner(self, conn: Connection, what: str) -> None:
        """Refuse to work across owners as a role that row-level security confines.

        Such a role sees no rows without an owner set: purging or re-embedding
        would find nothing and report 0, and expired memories would stay.
        """
        if self._confined(conn):
            role = conn.execute(sa.text("SELECT current_user")).scalar()
            raise ConfigError(
                self.db.setting,
                str(self.db.url),
                f"{what} works across owners, and row-level security confines role {role!r} to one; "
                "run it as the role that owns the memory tables (or one with BYPASSRLS)",
            )

    def _purge(self, now: datetime) -> int:
        sql = f"DELETE FROM {q.TABLE} WHERE expires_us <= :now_us RETURNING tableoid::regclass::text AS part"
        with self.db.begin() as conn:
            self._sees_every_owner(conn, "purge_expired")
            parts = [r.part for r in conn.execute(sa.text(sql), {"now_us": to_us(now)})]
            mark = conn.exec_driver_sql(MARK).scalar_one() if parts else ""
        if parts:
            partitions = sorted(set(parts))
            tables = partitions + [q.words_partition(p) for p in partitions]
            rewrite(self.db, tables, mark=mark, owner="(expired)")
        return len(parts)

    # --- re-embedding ---------------------------------------------------------------------

    def _count_stale(self, model: str) -> int:
        with self.db.read() as conn:
            self._sees_every_owner(conn, "reembed")
            sql = f"SELECT count(*) FROM {q.TABLE} WHERE model <> :m"
            return int(conn.execute(sa.text(sql), {"m": model}).scalar_one())

    def _stale(self, model: str, limit: int) -> list[tuple[str, str, str]]:
        sql = f"SELECT owner, id, content FROM {q.TABLE} WHERE model <> :m ORDER BY owner, id LIMIT :n"
        with self.db.read() as conn:
            return [(r.owner, r.id, r.content) for r in conn.execute(sa.text(sql), {"m": model, "n": limit})]

    def _set_vectors(
        self, model: str, rows: list[tuple[str, str, str]], vectors: Vectors, parts: Parts | None = None
    ) -> None:
        self._ensure_index(model, vectors.shape[1])
        sql = (
            f"UPDATE {q.TABLE} SET embedding = CAST(:v AS vector), sentences = CAST(:s AS vector[]), "
            "model = :m WHERE owner = :o AND id = :i AND content = :c"
        )
        each = parts or [None] * len(rows)
        params = [
            {"v": v, "s": None if p is None else list(p), "m": model, "o": o, "i": i, "c": c}
            for (o, i, c), v, p in zip(rows, np.asarray(vectors), each, strict=True)
        ]
        with self.db.begin() as conn:
            self._driver(conn)  # vectors in binary
            conn.execute(sa.text(sql), params)

    def _count_unsplit(self, model: str, most_chars: int) -> int:
        with self.db.read() as conn:
            self._sees_every_owner(conn, "embed_sentences")
            sql = f"SELECT count(*) FROM {q.TABLE} WHERE {_UNSPLIT}"
            return int(conn.execute(sa.text(sql), {"m": model, "n": most_chars}).scalar_one())

    def _unsplit(self, model: str, most_chars: int, limit: int) -> list[tuple[str, str, str]]:
        sql = f"SELECT owner, id, content FROM {q.TABLE} WHERE {_UNSPLIT} LIMIT :l"
        with self.db.read() as conn:
            found = conn.execute(sa.text(sql), {"m": model, "n": most_chars, "l": limit})
            return [(r.owner, r.id, r.content) for r in found]

    def _set_sentences(
        self, model: str, rows: list[tuple[str, str, str]], parts: list[Vectors]
    ) -> set[tuple[str, str]]:
        sql = (
            f"UPDATE {q.TABLE} SET sentences = CAST(:s AS vector[]) WHERE owner = :o AND id = :i "
            "AND content = :c AND model = :m AND sentences IS NULL"
        )  # an empty array: split, and no sentences (so it is not read again)
        stored = set()
        with self.db.begin() as conn:
            self._driver(conn)  # vectors in binary
            for (o, i, c), p in zip(rows, parts, strict=True):  # one statement each: its row count
                if conn.execute(sa.text(sql), {"s": list(p), "m": model, "o": o, "i": i, "c": c}).rowcount:
                    stored.add((o, i))
        return stored
