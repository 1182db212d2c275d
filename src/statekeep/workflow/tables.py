"""The workflow store's schema: one MetaData, its own SQL schema, numbered migrations.

The payload columns (``SEALED``) hold plain JSON, or, in a store opened with a
key ring, ``sk1:`` tokens sealed with the data key of the run's ``owner``.
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING

import sqlalchemy as sa
from sqlalchemy.engine import Connection

from statekeep.db import Database, Migration
from statekeep.db.catalog import StoreSpec, by_owner
from statekeep.db.dialects import no_statistics, schema_for
from statekeep.db.migrations import create_tables
from statekeep.db.types import UTCDateTime

if TYPE_CHECKING:
    from statekeep.workflow.base import WorkflowStore

SCHEMA = "statekeep_workflow"
metadata = sa.MetaData(schema=SCHEMA)

runs = sa.Table(
    "runs",
    metadata,
    sa.Column("run_id", sa.String(255), primary_key=True),
    sa.Column("workflow", sa.String(255), nullable=False),
    sa.Column("version", sa.Integer, nullable=False),
    sa.Column("input", sa.Text, nullable=False),
    sa.Column("input_hash", sa.String(64), nullable=False),
    sa.Column("status", sa.String(32), nullable=False),
    sa.Column("output", sa.Text),
    sa.Column("error", sa.Text),
    sa.Column("parent_id", sa.String(255), index=True),
    sa.Column("created_at", UTCDateTime, nullable=False),
    sa.Column("updated_at", UTCDateTime, nullable=False),
    sa.Column("finished_at", UTCDateTime),
    # when a worker may pick the run up; NULL while it waits on a person or has finished
    sa.Column("runnable_at", UTCDateTime, index=True),
    sa.Column("lease_owner", sa.String(255)),
    sa.Column("lease_expires_at", UTCDateTime),
    sa.Column("epoch", sa.Integer, nullable=False, default=0),
    # no longer read (workers before children waited for a lapsed lease took a child held through its
    # parent by this); every lease now writes NULL, so such a worker never takes a live child
    sa.Column("lease_parent_epoch", sa.Integer),
    sa.Column("state_schema", sa.String(255)),
    sa.Column("state_schema_version", sa.Integer),
    sa.Column("state_version", sa.Integer),
    sa.Column("cursor", sa.BigInteger),
    sa.Column("last_seq", sa.Integer, nullable=False, default=0),
    sa.Column("waiting", sa.Text),
    # the W3C trace context of the run's first span, so every attempt continues one trace
    sa.Column("trace_context", sa.Text),
    # whose data the run holds (erasure finds runs by it); NULL for a run of no one
    sa.Column("owner", sa.String(255), index=True),
)

steps = sa.Table(
    "steps",
    metadata,
    sa.Column("run_id", sa.String(255), primary_key=True),
    sa.Column("seq", sa.Integer, primary_key=True, autoincrement=False),
    sa.Column("name", sa.String(255), nullable=False),
    sa.Column("kind", sa.String(16), nullable=False),
    sa.Column("input_hash", sa.String(64), nullable=False),
    sa.Column("output", sa.Text, nullable=False),
    sa.Column("attempt", sa.Integer, nullable=False),
    sa.Column("started_at", UTCDateTime, nullable=False),
    sa.Column("finished_at", UTCDateTime, nullable=False),
    sa.Column("state_version", sa.Integer),
    sa.Column("cursor", sa.BigInteger),
)

tool_calls = sa.Table(
    "tool_calls",
    metadata,
    sa.Column("run_id", sa.String(255), primary_key=True),
    sa.Column("seq", sa.Integer, primary_key=True, autoincrement=False),
    sa.Column("tool", sa.String(255), nullable=False),
    sa.Column("key", sa.String(400), nullable=False, unique=True),
    sa.Column("args", sa.Text, nullable=False),
    sa.Column("status", sa.String(16), nullable=False),
    sa.Column("result", sa.Text),
    sa.Column("started_at", UTCDateTime, nullable=False),
    sa.Column("completed_at", UTCDateTime),
)

approvals = sa.Table(
    "approvals",
    metadata,
    sa.Column("approval_id", sa.String(64), primary_key=True),
    sa.Column("run_id", sa.String(255), nullable=False),
    sa.Column("seq", sa.Integer, nullable=False),
    sa.Column("kind", sa.String(16), nullable=False),
    sa.Column("action", sa.String(255), nullable=False),
    sa.Column("args", sa.Text, nullable=False),
    sa.Column("args_hash", sa.String(64), nullable=False),
    sa.Column("reason", sa.Text, nullable=False),
    sa.Column("status", sa.String(16), nullable=False, index=True),
    sa.Column("created_at", UTCDateTime, nullable=False),
    sa.Column("expires_at", UTCDateTime),
    sa.Column("decided_by", sa.String(255)),
    sa.Column("decided_at", UTCDateTime),
    sa.Column("comment", sa.Text),
    sa.Column("result", sa.Text),
    sa.Index("ix_approvals_run_seq", "run_id", "seq"),
)

events = sa.Table(
    "events",
    metadata,
    sa.Column("id", sa.Integer, sa.Identity(), primary_key=True),
    sa.Column("run_id", sa.String(255), nullable=False),
    sa.Column("name", sa.String(255), nullable=False),
    sa.Column("payload", sa.Text, nullable=False),
    sa.Column("created_at", UTCDateTime, nullable=False),
    sa.Column("consumed_seq", sa.Integer),
    sa.Index("ix_events_run_name", "run_id", "name"),
)


def _drop_approvals_run_id_index(conn: Connection) -> None:
    # Version 1 indexed approvals.run_id on its own; ix_approvals_run_seq, which
    # starts with run_id, serves every query that index did. Tables created since
    # this migration never had it, hence the check. A stand-in table, so that the
    # index never joins the live table's metadata.
    version_1 = sa.Table("approvals", sa.MetaData(schema=SCHEMA), sa.Column("run_id", sa.String(255)))
    sa.Index("ix_statekeep_workflow_approvals_run_id", version_1.c.run_id).drop(conn, checkfirst=True)


def _add_lease_parent_epoch(conn: Connection) -> None:
    # Tables created since this migration already have the column (migration 1 builds
    # them from the current metadata), hence the check.
    schema = _schema(conn)
    present = {c["name"] for c in sa.inspect(conn).get_columns("runs", schema=schema)}
    if "lease_parent_epoch" not in present:
        table = "runs" if schema is None else f"{schema}.runs"
        conn.execute(sa.text(f"ALTER TABLE {table} ADD COLUMN lease_parent_epoch INTEGER"))


def _add_trace_context(conn: Connection) -> None:
    # Tables created since this migration already have the column, hence the check.
    schema = _schema(conn)
    present = {c["name"] for c in sa.inspect(conn).get_columns("runs", schema=schema)}
    if "trace_context" not in present:
        table = "runs" if schema is None else f"{schema}.runs"
        conn.execute(sa.text(f"ALTER TABLE {table} ADD COLUMN trace_context TEXT"))


#: Payload columns sealed with the run owner's data key when the store has a key ring.
SEALED = {
    "runs": ("input", "output", "error"),
    "steps": ("output",),
    "tool_calls": ("args", "result"),
    "approvals": ("args", "comment", "result"),
    "events": ("payload",),
}
#: ANALYZE would copy sampled payloads and owner ids into pg_statistic, which erasure does not
#: rewrite; the planner needs neither.
NO_STATISTICS = {**SEALED, "runs": (*SEALED["runs"], "owner")}


def _add_run_owner(conn: Connection) -> None:
    # Tables created since this migration already have the column and its index.
    schema = _schema(conn)
    present = {c["name"] for c in sa.inspect(conn).get_columns("runs", schema=schema)}
    if "owner" not in present:
        table = "runs" if schema is None else f"{schema}.runs"
        conn.execute(sa.text(f"ALTER TABLE {table} ADD COLUMN owner VARCHAR(255)"))
    for index in runs.indexes:
        if "owner" in index.columns:
            index.create(conn, checkfirst=True)
    # Agent runs were started with (owner, session_id, task): their owner is in their input,
    # which was stored as plain JSON before runs had owners.
    legacy = sa.select(runs.c.run_id, runs.c.input).where(
        runs.c.owner.is_(None), runs.c.workflow.like("agent.%"), runs.c.parent_id.is_(None)
    )
    for run_id, text in list(conn.execute(legacy)):
        try:
            args = json.loads(text).get("args")
        except (ValueError, AttributeError):
            continue
        if isinstance(args, list) and len(args) == 3 and isinstance(args[0], str):
            conn.execute(runs.update().where(runs.c.run_id == run_id).values(owner=args[0]))
    no_statistics(conn, SCHEMA, NO_STATISTICS)


def _schema(conn: Connection) -> str | None:
    # SQLite has no schemas: the Database maps the store's schema away (see db.engine)
    return schema_for(conn, SCHEMA)


MIGRATIONS = [
    Migration(
        1,
        "runs, steps, tool_calls, approvals, events",
        create_tables(metadata, "runs", "steps", "tool_calls", "approvals", "events"),
    ),
    Migration(2, "drop the approvals index on run_id alone", _drop_approvals_run_id_index),
    Migration(3, "runs.lease_parent_epoch: children taken through their parent", _add_lease_parent_epoch),
    Migration(4, "runs.trace_context: a run's attempts continue one trace", _add_trace_context),
    Migration(5, "runs.owner: erasure finds an owner's runs; no statistics on payloads", _add_run_owner),
]


STORE: StoreSpec[WorkflowStore] = StoreSpec(
    "workflow", metadata, MIGRATIONS, sealed=SEALED, no_statistics=NO_STATISTICS, erase=by_owner
)


def setup(db: Database) -> None:
    """Create or upgrade the workflow tables (idempotent)."""
    STORE.upgrade(db)
