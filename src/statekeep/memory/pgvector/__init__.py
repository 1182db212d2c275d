"""The pgvector memory backend: PostgreSQL, shared by many workers on many machines (:mod:`.store`).

Its internals: the schema, migrations and statements (:mod:`._sql`), the search
statements (:mod:`._search`) and the one-round-trip psycopg pipeline (:mod:`._pipeline`).
"""

from statekeep.memory.pgvector.store import PgVectorMemoryStore

__all__ = ["PgVectorMemoryStore"]
