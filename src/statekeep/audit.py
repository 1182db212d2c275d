"""The audit log: who started, resumed, cancelled, approved, rejected, exported, erased or read what, when.

Append-only: the table refuses ``UPDATE`` and ``DELETE`` (a trigger on both
backends), and this module has no call that changes a record. A record names
the actor, the action, its target (a run, an approval, an owner) and counts;
it never holds the content acted on, so erasing an owner leaves nothing of
them here but the erasure record itself (the owner's id and the counts), which
is the proof of the erasure. The table lives in the workflow store's database,
schema ``statekeep_audit``.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, Literal, get_args

import sqlalchemy as sa
from sqlalchemy.engine import Connection

from statekeep._check import check_id, check_int
from statekeep.db import Database, Migration
from statekeep.db.catalog import StoreSpec
from statekeep.db.dialects import hooks
from statekeep.db.types import UTCDateTime
from statekeep.errors import InvalidInputError

SCHEMA = "statekeep_audit"

#: What a record says was done.
Action = Literal[
    "start",
    "resume",
    "cancel",
    "approve",
    "reject",
    "export",
    "erase",
    "read_memories",
    "forget_memories",
    "read_context",
    "read_state",
    "read_run",
    "rotate_keys",
    "reencrypt",
]
ACTIONS: tuple[str, ...] = get_args(Action)
#: Where the action came from.
Via = Literal["cli", "webhook", "api"]

metadata = sa.MetaData(schema=SCHEMA)
entries_table = sa.Table(
    "audit_log",
    metadata,
    sa.Column("id", sa.BigInteger().with_variant(sa.Integer, "sqlite"), sa.Identity(), primary_key=True),
    sa.Column("at", UTCDateTime, nullable=False),
    sa.Column("actor", sa.String(255), nullable=False),
    sa.Column("action", sa.String(32), nullable=False),
    sa.Column("target", sa.String(255)),
    sa.Column("via", sa.String(16), nullable=False),
    # counts and ids only, as JSON
    sa.Column("detail", sa.Text, nullable=False),
    sa.Index("audit_log_target", "target"),
)


def _create(conn: Connection) -> None:
    metadata.create_all(conn, tables=[entries_table])
    hooks(conn.dialect).append_only(conn, SCHEMA, entries_table.name, "the audit log is append-only")


MIGRATIONS = [Migration(1, "audit_log, append-only", _create)]

#: The audit log keeps the records of an erased owner (ids and counts, never content) as the
#: proof of the erasure: nothing to erase.
STORE: StoreSpec[Database] = StoreSpec("audit", metadata, MIGRATIONS, lives_in="workflow")


@dataclass(frozen=True, slots=True)
class AuditEntry:
    """One record of the audit log.

    Attributes:
        id: Its position in the log (increasing).
        at: When it was recorded (UTC).
        actor: Who acted: a person's identity (webhook token, ``--as``, the OS user).
        action: What was done (:data:`Action`).
        target: What it was done to: a run id, an approval id, an owner id.
        via: ``cli``, ``webhook`` or ``api``.
        detail: Counts and ids (never content).
    """

    id: int
    at: datetime
    actor: str
    action: str
    target: str | None
    via: str
    detail: dict[str, Any]

    def as_dict(self) -> dict[str, Any]:
        """The entry as a JSON-ready dict."""
        return {
            "id": self.id,
            "at": self.at.isoformat(),
            "actor": self.actor,
            "action": self.action,
            "target": self.target,
            "via": self.via,
            "detail": self.detail,
        }


class AuditLog:
    """The append-only audit log of a database (by default the workflow store's).

    Examples:
        >>> log = AuditLog("sqlite:///:memory:")
        >>> log.record("alice@example.com", "cancel", "run-7", via="cli").action
        'cancel'
        >>> [e.target for e in log.entries()]
        ['run-7']
    """

    def __init__(self, db: Database | str) -> None:
        self.db = db if isinstance(db, Database) else Database(db, setting="STATEKEEP_WORKFLOW_URL")
        STORE.upgrade(self.db)

    def record(
        self,
        actor: str,
        action: Action,
        target: str | None = None,
        *,
        via: Via = "api",
        detail: Mapping[str, int | str | bool | None] | None = None,
    ) -> AuditEntry:
        """Append one record.

        ``detail`` holds counts and ids only: integers, booleans, and strings of at
        most 255 characters (an id, a status), never content.

        Raises:
            InvalidInputError: an unknown action or ``via``, an empty actor, or a detail
                value that is not a count or an id.
        """
        check_id(actor, "actor")
        if action not in ACTIONS:
            raise InvalidInputError(f"must be one of {ACTIONS}", field="action")
        if via not in get_args(Via):
            raise InvalidInputError("must be cli, webhook or api", field="via")
        if target is not None:
            check_id(target, "target")
        facts = dict(detail or {})
        for key, value in facts.items():
            check_id(key, "detail")
            if isinstance(value, str):
                check_id(value, f"detail.{key}")
            elif value is not None and not isinstance(value, int | bool):
                raise InvalidInputError("must be a count, a flag or an id", field=f"detail.{key}")
        at = datetime.now(UTC)
        values = {
            "at": at,
            "actor": actor,
            "action": action,
            "target": target,
            "via": via,
            "detail": json.dumps(facts, sort_keys=True),
        }
        with self.db.begin("writing the audit log") as conn:
            insert = entries_table.insert().values(values).returning(entries_table.c.id)
            new_id = conn.execute(insert).scalar_one()
        return AuditEntry(int(new_id), at, actor, action, target, via, facts)

    def entries(
        self,
        *,
        limit: int = 100,
        action: str | None = None,
        actor: str | None = None,
        target: str | None = None,
    ) -> list[AuditEntry]:
        """The newest records first, optionally only of one action, actor or target."""
        check_int(limit, "limit", minimum=1)
        q = sa.select(entries_table).order_by(entries_table.c.id.desc()).limit(limit)
        for column, value in (("action", action), ("actor", actor), ("target", target)):
            if value is not None:
                q = q.where(entries_table.c[column] == check_id(value, column))
        with self.db.read("reading the audit log") as conn:
            return [
                AuditEntry(int(r.id), r.at, r.actor, r.action, r.target, r.via, json.loads(r.detail))
                for r in conn.execute(q)
            ]
