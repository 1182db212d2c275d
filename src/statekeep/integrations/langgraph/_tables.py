"""The saver's own schema: LangGraph checkpoints, channel blobs and pending writes.

They live beside the workflow store's tables (same database, their own SQL schema
``statekeep_langgraph`` on PostgreSQL) because a LangGraph checkpoint is not a
workflow step: it names channel versions, not a journal position.

A blob row is either a whole serialized channel value or, for a list channel that
only grew, a *delta*: the serialized items appended since ``base_version`` of the
same channel, and how many (``added``). Deltas keep an append-only ``messages``
channel linear in the number of steps; reads join the chain back together.

A deleted thread leaves one row in ``deleted_threads``: the SHA-256 of its id (not the
id) and its *horizon*, the greatest checkpoint id it had or the delete's moment's; each
late checkpoint refused since leaves a row in ``refused_checkpoints``. Late writes of a
stale worker are checked against both (see ``_deleted``).

A thread written with an owner (``config["configurable"]["owner"]``, see ``_owners``) has a
row in ``threads`` that names it: erasing the owner deletes those threads. On PostgreSQL no
column that holds a thread id, an owner or a serialized value is sampled by ``ANALYZE``: a
sample in ``pg_statistic`` would outlive the rows' erasure.
"""

from __future__ import annotations

import sqlalchemy as sa
from sqlalchemy.engine import Connection

from statekeep.db import Database, Migration, upgrade
from statekeep.db.catalog import Erased, Erasing, StoreSpec
from statekeep.db.dialects import no_statistics
from statekeep.db.migrations import create_tables

SCHEMA = "statekeep_langgraph"
metadata = sa.MetaData(schema=SCHEMA)

checkpoints = sa.Table(
    "checkpoints",
    metadata,
    sa.Column("thread_id", sa.String(255), primary_key=True),
    sa.Column("checkpoint_ns", sa.String(255), primary_key=True),
    sa.Column("checkpoint_id", sa.String(64), primary_key=True),
    sa.Column("parent_checkpoint_id", sa.String(64)),
    # the run that wrote it (metadata["run_id"]), for delete_for_runs
    sa.Column("run_id", sa.String(255), index=True),
    sa.Column("type", sa.String(32), nullable=False),
    # the checkpoint without its channel values, through the saver's serde
    sa.Column("checkpoint", sa.LargeBinary, nullable=False),
    sa.Column("metadata_type", sa.String(32), nullable=False),
    sa.Column("metadata", sa.LargeBinary, nullable=False),
    # {channel: version} as JSON text: what blobs the checkpoint reaches (garbage collection)
    sa.Column("versions", sa.Text, nullable=False),
)

blobs = sa.Table(
    "blobs",
    metadata,
    sa.Column("thread_id", sa.String(255), primary_key=True),
    sa.Column("checkpoint_ns", sa.String(255), primary_key=True),
    sa.Column("channel", sa.String(255), primary_key=True),
    sa.Column("version", sa.String(64), primary_key=True),
    # a serde type ("msgpack", "bytes"...), "empty" for a channel without value, or "delta"
    sa.Column("type", sa.String(32), nullable=False),
    sa.Column("blob", sa.LargeBinary),
    sa.Column("base_version", sa.String(64)),
    sa.Column("added", sa.Integer),
)

writes = sa.Table(
    "writes",
    metadata,
    sa.Column("thread_id", sa.String(255), primary_key=True),
    sa.Column("checkpoint_ns", sa.String(255), primary_key=True),
    sa.Column("checkpoint_id", sa.String(64), primary_key=True),
    sa.Column("task_id", sa.String(255), primary_key=True),
    sa.Column("idx", sa.Integer, primary_key=True, autoincrement=False),
    sa.Column("channel", sa.String(255), nullable=False),
    sa.Column("type", sa.String(32), nullable=False),
    sa.Column("blob", sa.LargeBinary, nullable=False),
    sa.Column("task_path", sa.String(1024), nullable=False, default=""),
)

deleted_threads = sa.Table(
    "deleted_threads",
    metadata,
    # SHA-256 (hex) of the thread id: the erased thread's id is not kept in the clear
    sa.Column("thread_key", sa.String(64), primary_key=True),
    # the greatest checkpoint id the thread had, or the delete's moment's: a checkpoint up to it,
    # and writes to a missing checkpoint up to it, are late
    sa.Column("horizon", sa.String(64), nullable=False),
)

refused_checkpoints = sa.Table(
    "refused_checkpoints",
    metadata,
    # a late checkpoint of a deleted thread that was not stored: its writes are not stored either
    sa.Column("thread_key", sa.String(64), primary_key=True),
    sa.Column("checkpoint_ns", sa.String(255), primary_key=True),
    sa.Column("checkpoint_id", sa.String(64), primary_key=True),
)

threads = sa.Table(
    "threads",
    metadata,
    sa.Column("thread_id", sa.String(255), primary_key=True),
    # the owner the thread's first write named: erasing the owner deletes the thread
    sa.Column("owner", sa.String(255), nullable=False, index=True),
)

#: The columns ``ANALYZE`` must not sample: thread ids, owners and serialized values.
PRIVATE = {
    "checkpoints": ("thread_id", "checkpoint", "metadata"),
    "blobs": ("thread_id", "blob"),
    "writes": ("thread_id", "blob"),
    "threads": ("thread_id", "owner"),
}


def _no_statistics(conn: Connection) -> None:
    # ANALYZE would copy sampled values into pg_statistic, which erasure does not rewrite
    no_statistics(conn, SCHEMA, PRIVATE)


MIGRATIONS = [
    Migration(1, "checkpoints, blobs, writes", create_tables(metadata, "checkpoints", "blobs", "writes")),
    Migration(2, "deleted threads", create_tables(metadata, "deleted_threads")),
    Migration(3, "refused late checkpoints", create_tables(metadata, "refused_checkpoints")),
    Migration(4, "threads: the owner of each owned thread", create_tables(metadata, "threads")),
    Migration(5, "no statistics on thread ids, owners and values (PostgreSQL)", _no_statistics),
]


def _erase(db: Database | None, erasing: Erasing) -> Erased | None:
    """The owner's threads (those the saver recorded as theirs) in the workflow store's database."""
    if db is None:
        return None
    from statekeep.integrations.langgraph.erasure import erase_threads

    return Erased(dict(erase_threads(db, erasing.owner)))


#: The saver's declaration: its tables live with the workflow store's; an owner's threads are
#: those written with the owner in their config (``StatekeepSaver(owner_key=...)``).
STORE: StoreSpec[Database] = StoreSpec(
    "langgraph", metadata, MIGRATIONS, lives_in="workflow", no_statistics=PRIVATE, erase=_erase
)


def setup(db: Database) -> None:
    """Create or upgrade the saver's tables (idempotent)."""
    upgrade(db, "langgraph", SCHEMA, MIGRATIONS)
