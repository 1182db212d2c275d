"""Re-encryption after a rotation: seal again what retired keys sealed, then drop those keys.

``statekeep keys rotate`` retires every owner's data key (new writes get new
ones, old rows stay readable); :func:`reencrypt` then walks every sealed column
the stores declare (:mod:`statekeep.stores`), page by page, opens each value
sealed under a retired key and seals it again under its owner's current key,
re-wraps the data keys still under an older key-encryption key, and finally
drops the retired data keys that no process can still be using.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from datetime import UTC, datetime
from typing import Any

import sqlalchemy as sa

from statekeep.db import Database
from statekeep.db.catalog import StoreSpec
from statekeep.db.dialects import schema_for
from statekeep.keys.ring import KeyRing, key_id_of

PAGE = 500


def reseal_table(
    ring: KeyRing, db: Database, table: sa.Table, columns: Sequence[str], retired: set[str]
) -> int:
    """Seal again every value of ``columns`` sealed under a ``retired`` key; return how many."""
    if not retired:
        return 0
    pk = list(table.primary_key.columns)
    done = 0
    last: tuple[object, ...] | None = None
    while True:
        q = sa.select(*pk, *(table.c[c] for c in columns)).order_by(*pk).limit(PAGE)
        if last is not None:
            q = q.where(sa.tuple_(*pk) > sa.tuple_(*last))
        with db.read("re-encrypting: reading a page") as conn:
            rows = list(conn.execute(q))
        if not rows:
            return done
        for row in rows:
            key = tuple(row[: len(pk)])
            values = dict(zip(columns, row[len(pk) :], strict=True))
            changed = {}
            for column, value in values.items():
                dek_id = key_id_of(value) if isinstance(value, str) else None
                if dek_id is not None and dek_id in retired:
                    owner = ring.owner_of_key(dek_id)
                    ring.prepare(owner)
                    changed[column] = ring.seal(owner, ring.open(value))
            if changed:
                where = sa.and_(*(c == v for c, v in zip(pk, key, strict=True)))
                with db.begin("re-encrypting a row") as conn:
                    conn.execute(table.update().where(where).values(changed))
                done += len(changed)
        last = tuple(rows[-1][: len(pk)])


def reencrypt(ring: KeyRing, urls: Mapping[str, str | Database]) -> dict[str, int]:
    """Re-encrypt the stores at these URLs (or databases), by store name: every column each declares sealed.

    The names are those of :mod:`statekeep.stores` (``context``, ``working``,
    ``workflow``, ``agents``...). Returns counts: values re-sealed per store, data
    keys re-wrapped, retired keys dropped.
    """
    from statekeep.stores import declaration

    started = datetime.now(UTC)
    retired = ring.retired()
    report: dict[str, int] = {}
    opened: list[Database] = []
    for store, found in urls.items():
        spec = declaration(store)
        db = found if isinstance(found, Database) else Database(found)
        if not isinstance(found, Database):
            opened.append(db)
        report[f"{store}.resealed"] = _reseal_store(ring, db, spec, retired)
    for db in opened:
        db.dispose()
    report["data_keys.dropped"] = ring.drop_retired(started)
    report["data_keys.rewrapped"] = ring.rewrap()
    return report


def _reseal_store(ring: KeyRing, db: Database, spec: StoreSpec[Any], retired: set[str]) -> int:
    """Seal again what ``retired`` keys sealed in each sealed column ``spec`` declares; how many."""
    if not spec.sealed:
        return 0
    assert spec.schema is not None
    db.register_schema(spec.schema)
    total = 0
    for name, columns in spec.sealed.items():
        table = spec.table(name)
        with db.read() as conn:
            present = sa.inspect(conn).has_table(table.name, schema=schema_for(conn, spec.schema))
        if present:  # a store that was never set up in this database has nothing sealed
            total += reseal_table(ring, db, table, columns, retired)
    return total
