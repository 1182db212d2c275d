"""How the pgvector store talks to PostgreSQL: one pipelined round trip per call, vectors in binary.

A call's statements, its owner setting (row-level security lets only that
owner's rows through) and, for a search, the planner settings go out in one
psycopg pipeline with their ``BEGIN`` and ``COMMIT``; numpy vectors travel in
pgvector's binary format and jsonb comes back through a leaner loader.
:class:`Pipeline` is the store's collaborator that does it (``PgVectorMemoryStore._pipe``).
"""

from __future__ import annotations

import json
import time
import weakref
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import psycopg
import sqlalchemy as sa
from pgvector.psycopg.vector import register_vector_info
from psycopg import pq
from psycopg.abc import Buffer
from psycopg.adapt import Loader
from psycopg.rows import dict_row
from psycopg.types import TypeInfo
from sqlalchemy.engine import Connection

import statekeep.memory.pgvector._sql as q
from statekeep.db import Database
from statekeep.db.engine import storage_error

#: How long searches trust what they learnt of an owner's size (exact search, or the HNSW index).
SIZE_HINT_SECONDS = 30.0


@dataclass(frozen=True)
class Statement:
    """One statement of a pipelined transaction: ``:name`` SQL, its parameters, run once or per row."""

    sql: str
    params: Mapping[str, Any] | Sequence[Mapping[str, Any]]
    many: bool = False


class JsonbLoader(Loader):
    """jsonb as psycopg loads it (``json.loads``), without its per-value detour through bytes detection.

    A search decodes the metadata of every memory it returns; most of them hold
    none (``{}``), and psycopg's loader spent more on those than on the rest of the row.
    """

    def load(self, data: Buffer) -> Any:
        text = bytes(data).decode()
        return {} if text == "{}" else json.loads(text)


def fetched(cursor: psycopg.Cursor[dict[str, Any]]) -> list[dict[str, Any]]:
    """Every row a cursor received (none for an ``executemany``)."""
    rows: list[dict[str, Any]] = []
    while True:
        result = cursor.pgresult  # its status, not ``description``: that builds a Column per column
        if result is not None and result.status == pq.ExecStatus.TUPLES_OK:
            rows.extend(cursor.fetchall())
        if not cursor.nextset():
            return rows


class Pipeline:
    """Scoped transactions and pipelined statements over one database, and what they learn on the way:
    the vector type, the connections that send vectors in binary, the owners' sizes.

    Args:
        db: the PostgreSQL database.
        ef_search: HNSW candidate list size of a search.
        exact_below: an owner with fewer memories is searched exactly, a bigger one through the index.
    """

    def __init__(self, db: Database, ef_search: int, exact_below: int) -> None:
        self.db = db
        self.ef_search = ef_search
        self.exact_below = exact_below
        self._vector_type: TypeInfo | None = None
        self._binary: weakref.WeakSet[psycopg.Connection[Any]] = weakref.WeakSet()
        self._big: dict[str, tuple[bool, float]] = {}  # owner -> (searched through HNSW, when learnt)

    def forget_size(self, owner: str | None = None) -> None:
        """Learn the size of ``owner`` (of every owner, for None) again at its next search."""
        if owner is None:
            self._big.clear()
        else:
            self._big.pop(owner, None)

    def driver(self, conn: Connection) -> psycopg.Connection[Any]:
        """The psycopg connection under ``conn``, sending numpy vectors in pgvector's binary format."""
        return self.binary_vectors(conn.connection.driver_connection)  # type: ignore[arg-type]

    def binary_vectors(self, raw: psycopg.Connection[Any]) -> psycopg.Connection[Any]:
        """``raw``, with pgvector's binary dumper registered for numpy vectors (once per connection)."""
        if raw not in self._binary:
            if self._vector_type is None:
                self._vector_type = TypeInfo.fetch(raw, "vector")
            register_vector_info(raw, self._vector_type)  # registers no loader we use; dumpers only
            raw.adapters.register_loader("jsonb", JsonbLoader)  # the same values, sooner
            self._binary.add(raw)
        return raw

    @contextmanager
    def scoped(self, owner: str, *, write: bool = True) -> Iterator[Connection]:
        """A transaction in which row-level security lets only ``owner``'s rows through."""
        what = f"{'writing' if write else 'reading'} memories of {owner!r}"
        with self.db.begin(what) if write else self.db.read(what) as conn:
            self.driver(conn)
            conn.execute(sa.text(f"SELECT set_config('{q.OWNER_SETTING}', :o, true)"), {"o": owner})
            yield conn

    def run(
        self, owner: str, statements: list[Statement], *, write: bool, search: bool = False
    ) -> list[list[dict[str, Any]]]:
        """Run statements in one transaction scoped to ``owner``, in one round trip; return their rows.

        The owner setting (row-level security lets only its rows through) and, for a
        search, the planner settings open the transaction in one ``set_config``
        statement; the statements and the commit follow in the same psycopg pipeline.
        A read of one statement needs no ``BEGIN`` and ``COMMIT``: the statements of a
        pipeline up to its sync are one transaction, and one statement sees one snapshot.
        A search sets: custom plans always (a generic plan of a prepared statement
        neither prunes partitions at plan time nor uses the index well); HNSW iterative
        scans, so filters cannot shrink the result; and, for an owner at least
        ``exact_below`` big, no sort of every row (ORDER BY ... LIMIT through the index).
        """
        settings = {q.OWNER_SETTING: owner}
        if search:
            settings |= {
                "plan_cache_mode": "force_custom_plan",
                "hnsw.iterative_scan": "relaxed_order",
                "hnsw.ef_search": str(self.ef_search),
            }
            if self.is_big(owner):
                settings["enable_sort"] = "off"
        what = f"{'writing' if write else 'reading'} memories of {owner!r}"
        try:
            with self.pooled(what) as raw:
                cursors = []
                # psycopg would sync after its own BEGIN and again after COMMIT: send both ourselves,
                # queued with the statements, so that the pipeline's one sync is the one round trip
                raw.autocommit = True
                explicit = write or len(statements) > 1  # else the sync ends the (implicit) transaction
                try:
                    with raw.pipeline():
                        if explicit:
                            raw.execute(q.BEGIN_WRITE if write else q.BEGIN_READ)
                        values = {f"s{i}": v for i, v in enumerate(settings.values())}
                        raw.execute(q.settings_sql(tuple(settings)), values)
                        for statement in statements:
                            cursor = raw.cursor(row_factory=dict_row)
                            sql = q.pyformat(statement.sql)
                            if statement.many:
                                # without returning: fetching rows mid-pipeline would wait for them
                                cursor.executemany(sql, statement.params)
                            else:
                                cursor.execute(sql, statement.params)
                            cursors.append(cursor)
                        if explicit:
                            raw.execute("COMMIT")
                finally:
                    if raw.info.transaction_status != pq.TransactionStatus.IDLE:
                        raw.rollback()  # a statement failed: the rest was skipped, the transaction aborted
                    raw.autocommit = False  # as the pool hands connections out
                return [fetched(cursor) for cursor in cursors]
        except psycopg.Error as exc:
            raise storage_error(exc, what) from exc

    @contextmanager
    def pooled(self, what: str) -> Iterator[psycopg.Connection[Any]]:
        """A pooled psycopg connection, without SQLAlchemy's transaction: :meth:`run` sends its own."""
        try:
            pooled = self.db.engine.raw_connection()  # checked out (and pinged if idle) as db.begin does
        except sa.exc.DBAPIError as exc:
            raise storage_error(exc, what) from exc
        try:
            yield self.binary_vectors(pooled.driver_connection)  # type: ignore[arg-type]
        finally:
            pooled.close()  # back to the pool, which rolls back whatever is left open

    def is_big(self, owner: str) -> bool:
        """Whether the owner has at least ``exact_below`` memories (learnt at most SIZE_HINT_SECONDS ago).

        Only the plan depends on it (exact, or through the index), never which rows may be seen.
        """
        hint = self._big.get(owner)
        if hint is None or time.monotonic() - hint[1] > SIZE_HINT_SECONDS:
            count = Statement(q.OWNER_SIZE, {"owner": owner})
            rows = self.run(owner, [count], write=False)[0]
            if len(self._big) > 10_000:
                self._big.clear()
            hint = self._big[owner] = (int(rows[0]["count"]) >= self.exact_below, time.monotonic())
        return hint[0]
