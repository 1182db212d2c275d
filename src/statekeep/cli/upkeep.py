"""Commands that keep the data: erasure, keys, the audit log, the schema, and the demo."""

from __future__ import annotations

import getpass
import json
from typing import Annotated

import typer
from rich.table import Table

from statekeep.cli._common import (
    ACTOR,
    DatabaseURL,
    Home,
    MemoryURL,
    app,
    checked_settings,
    console,
    db_app,
    keys_app,
    literal,
    record_audit,
)
from statekeep.config import Settings
from statekeep.errors import InvalidInputError

# --- erasure, keys and the audit log ------------------------------------------------------------


@app.command()
def erase(
    owner: Annotated[str, typer.Argument(help="The owner id whose data is erased from every store.")],
    yes: Annotated[bool, typer.Option("--yes", help="Do not ask for confirmation.")] = False,
    cancel_live: Annotated[
        bool, typer.Option("--cancel-live", help="Cancel the owner's live runs first (else: refuse).")
    ] = False,
    database_url: DatabaseURL = None,
    home: Home = None,
    memory_url: MemoryURL = None,
) -> None:
    """Erase everything of an owner from every store (sessions, runs, memories, keys); print the receipt."""
    from statekeep.audit import AuditLog
    from statekeep.context import SQLContextStore
    from statekeep.erasure import erase_owner
    from statekeep.keys import open_key_ring
    from statekeep.memory import open_memory_store
    from statekeep.stores import Databases
    from statekeep.workflow import SQLWorkflowStore
    from statekeep.working import SQLWorkingStateStore

    if not yes and not typer.confirm(f"Erase EVERYTHING of owner {owner!r}, in every store?"):
        raise typer.Abort()
    settings = checked_settings(database_url, home, memory_url)
    databases = Databases(settings)  # each store's database, as it declares; one per URL
    keys = open_key_ring(settings, databases.of("keys"))
    context = SQLContextStore(databases.of("context"), keys=keys)
    working = SQLWorkingStateStore(databases.of("working"), keys=keys)
    workflow = SQLWorkflowStore(databases.of("workflow"), keys=keys)
    log = AuditLog(databases.of("audit"))
    try:  # a refusal (live runs) releases every connection too
        with open_memory_store(settings.memory_url) as memory:
            receipt = erase_owner(
                owner,
                context=context,
                working=working,
                workflow=workflow,
                memory=memory,
                keys=keys,
                cancel_live=cancel_live,
            )
        actor = ACTOR.get("name") or getpass.getuser()
        log.record(actor, "erase", owner, via="cli", detail=receipt.counts())
    finally:
        databases.dispose()
    console.print_json(json.dumps(receipt.as_dict()))


@app.command("audit")
def audit_list(
    limit: Annotated[int, typer.Option(help="Show at most this many records, newest first.")] = 100,
    action: Annotated[str | None, typer.Option(help="Only this action (erase, approve, ...).")] = None,
    target: Annotated[
        str | None, typer.Option(help="Only records about this run, approval or owner id.")
    ] = None,
    as_json: Annotated[bool, typer.Option("--json", help="JSON lines instead of a table.")] = False,
    database_url: DatabaseURL = None,
    home: Home = None,
) -> None:
    """The audit log, newest first: who did what, to what, when (counts only, never content)."""
    from statekeep.audit import AuditLog

    log = AuditLog(checked_settings(database_url, home).url_for("workflow"))
    found = log.entries(limit=limit, action=action, target=target)
    log.db.dispose()
    if as_json:
        for entry in found:
            print(json.dumps(entry.as_dict()))
        return
    table = Table("time", "actor", "action", "target", "via", "detail")
    for e in found:
        detail = ", ".join(f"{k}={v}" for k, v in e.detail.items())
        table.add_row(f"{e.at:%Y-%m-%d %H:%M:%S}", e.actor, e.action, e.target or "-", e.via, detail)
    console.print(table)


@keys_app.command("rotate")
def keys_rotate(database_url: DatabaseURL = None, home: Home = None) -> None:
    """New key-encryption key (local key file) and new data keys; old rows stay readable until reencrypt."""
    from statekeep.keys import open_key_ring

    keys = open_key_ring(checked_settings(database_url, home))
    if keys is None:
        raise InvalidInputError("encryption is off (STATEKEEP_KEYS=none)", field="STATEKEEP_KEYS")
    new = keys.rotate()
    record_audit(database_url, home, "rotate_keys", None, {"key_encryption_key": new})
    console.print(f"new writes use new data keys{f'; key-encryption key {new}' if new else ''}")
    keys.db.dispose()


@keys_app.command("reencrypt")
def keys_reencrypt(database_url: DatabaseURL = None, home: Home = None) -> None:
    """Seal again every value sealed under a retired data key, re-wrap old data keys, drop unused ones."""
    from statekeep.keys import open_key_ring, reencrypt

    settings = checked_settings(database_url, home)
    keys = open_key_ring(settings)
    if keys is None:
        raise InvalidInputError("encryption is off (STATEKEEP_KEYS=none)", field="STATEKEEP_KEYS")
    from statekeep.stores import Databases, declared

    # every store that declares sealed columns, in the database of the store its tables live in
    databases = Databases(settings)
    try:
        report = reencrypt(
            keys, {s.name: databases.of(s.name) for s in declared() if s.sealed and s.lives_in}
        )
    finally:
        databases.dispose()
    record_audit(database_url, home, "reencrypt", None, report)
    console.print_json(json.dumps(report))
    keys.db.dispose()


# --- database and demo -------------------------------------------------------------------------


@db_app.command("upgrade")
def db_upgrade(database_url: DatabaseURL = None, home: Home = None) -> None:
    """Create or upgrade every SQL store's tables (idempotent; safe from many workers)."""
    from statekeep.keys import provider_for
    from statekeep.stores import Databases, declared

    settings = checked_settings(database_url, home)
    provider_for(settings)  # a key provider that cannot be built is a deploy-time error, not a first seal's
    databases = Databases(settings)
    try:
        for spec in declared():
            if spec.lives_in is None or (spec.enabled is not None and not spec.enabled(settings)):
                continue  # memory: its backends create their own tables; keys: encryption is off
            spec.upgrade(databases.of(spec.name))
            console.print(f"{spec.name}: up to date")
    finally:
        databases.dispose()


@app.command()
def demo(database_url: DatabaseURL = None, home: Home = None, memory_url: MemoryURL = None) -> None:
    """Run the narrated demo, in <home>/demo (or on --database-url), and say how to look at it."""
    from statekeep import demo as demo_module
    from statekeep._redact import redact_url

    settings = Settings.load(home=home, database_url=database_url, memory_url=memory_url)
    where = settings.home / "demo"
    console.print(
        literal(f"The demo writes its stores under {where}/ (it removes what an earlier demo left there).")
    )
    demo_module.run(settings, console)
    if settings.database_url.startswith("sqlite"):
        look = f"--home {where}"
    else:
        look = f"--database-url '{redact_url(settings.database_url)}'"
    console.print()
    console.print(literal(f"The demo's run and memories are in {where}/; look at them with:"))
    for command in ("runs list", "runs events <run id>", "approvals list --all"):
        console.print(literal(f"    statekeep {command} {look}"))
