"""The ``statekeep`` command line: runs, approvals, workers, memory, context, erasure, keys, the audit log.

Every command reads the same settings as the library (``--database-url``,
``--memory-url``, ``--home`` or the ``STATEKEEP_*`` environment). A failure
prints a one-line reason and exits non-zero, without a traceback. Commands
that act on a run, an approval or a person's data are recorded in the audit
log under ``statekeep --as NAME`` (``STATEKEEP_ACTOR``; default: the OS user).
"""

from __future__ import annotations

import getpass
import importlib
import json
import re
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer
from rich.console import Console
from rich.highlighter import JSONHighlighter
from rich.progress import Progress
from rich.table import Table
from rich.text import Text

from statekeep.config import Settings
from statekeep.errors import InvalidInputError, StatekeepError

if TYPE_CHECKING:
    from statekeep.audit import Action
    from statekeep.db import Database
    from statekeep.memory import MemoryStore
    from statekeep.runtime import Runtime
    from statekeep.workflow import WorkflowStore

app = typer.Typer(help="Durable state for AI agents.", no_args_is_help=True, pretty_exceptions_enable=False)
runs_app = typer.Typer(help="Workflow runs.", no_args_is_help=True)
approvals_app = typer.Typer(help="Approvals waiting for a person.", no_args_is_help=True)
memory_app = typer.Typer(help="Long-term memory, per owner.", no_args_is_help=True)
context_app = typer.Typer(help="Session context.", no_args_is_help=True)
db_app = typer.Typer(help="Database schema.", no_args_is_help=True)
keys_app = typer.Typer(help="Encryption keys: rotation and re-encryption.", no_args_is_help=True)
for sub, name in (
    (runs_app, "runs"),
    (approvals_app, "approvals"),
    (memory_app, "memory"),
    (context_app, "context"),
    (db_app, "db"),
    (keys_app, "keys"),
):
    app.add_typer(sub, name=name)
console = Console()
err_console = Console(stderr=True)

DatabaseURL = Annotated[
    str | None, typer.Option("--database-url", envvar="STATEKEEP_DATABASE_URL", help="URL of the SQL stores.")
]
MemoryURL = Annotated[
    str | None, typer.Option("--memory-url", envvar="STATEKEEP_MEMORY_URL", help="Memory folder or URL.")
]
Home = Annotated[str | None, typer.Option("--home", envvar="STATEKEEP_HOME", help="Embedded data folder.")]


#: who runs this command, for the audit log (``--as``)
_ACTOR: dict[str, str] = {}


@app.callback()
def _identify(
    as_: Annotated[
        str | None,
        typer.Option("--as", envvar="STATEKEEP_ACTOR", help="Who you are, for the audit log."),
    ] = None,
) -> None:
    """Durable state for AI agents."""
    _ACTOR["name"] = as_ or getpass.getuser()


def _audit(
    database_url: str | None,
    home: str | None,
    action: Action,
    target: str | None,
    detail: Mapping[str, int | str | bool | None] | None = None,
) -> None:
    """Record a command in the audit log (never the content it showed or changed)."""
    from statekeep.audit import AuditLog

    log = AuditLog(_settings(database_url, home).url_for("workflow"))
    try:
        log.record(_ACTOR.get("name") or getpass.getuser(), action, target, via="cli", detail=detail)
    finally:
        log.db.dispose()


def _settings(database_url: str | None, home: str | None, memory_url: str | None = None) -> Settings:
    settings = Settings.load(home=home, database_url=database_url, memory_url=memory_url)
    settings.check()
    return settings


#: Databases a command opened; main() closes their connections when the command ends, so a
#: PostgreSQL server sees them closed, not dropped (and an in-process caller leaks none).
_OPENED: list[Database] = []


def _opened(db: Database) -> Database:
    _OPENED.append(db)
    return db


def _workflow(database_url: str | None, home: str | None) -> WorkflowStore:
    from statekeep.keys import open_key_ring
    from statekeep.workflow import SQLWorkflowStore

    settings = _settings(database_url, home)
    store = SQLWorkflowStore(settings.url_for("workflow"), keys=open_key_ring(settings))
    _opened(store.db)
    return store


def _memory(database_url: str | None, home: str | None, memory_url: str | None) -> MemoryStore:
    from statekeep.memory import open_memory_store

    return open_memory_store(_settings(database_url, home, memory_url).memory_url)


# --- runs ------------------------------------------------------------------------------------


@runs_app.command("list")
def runs_list(
    status: Annotated[str | None, typer.Option(help="Only runs in this status.")] = None,
    workflow: Annotated[str | None, typer.Option(help="Only runs of this workflow.")] = None,
    limit: int = 100,
    database_url: DatabaseURL = None,
    home: Home = None,
) -> None:
    """List runs, oldest first."""
    from statekeep.workflow import RunStatus

    wanted = None if status is None else _status(status, RunStatus)
    table = Table("run id", "workflow", "status", "steps", "updated")
    for run in _workflow(database_url, home).list_runs(status=wanted, workflow=workflow, limit=limit):
        table.add_row(
            literal(run.run_id),
            literal(f"{run.workflow} v{run.version}"),
            literal(run.status),
            str(run.last_seq),
            f"{run.updated_at:%Y-%m-%d %H:%M:%S}",
        )
    console.print(table)


@runs_app.command("show")
def runs_show(run_id: str, database_url: DatabaseURL = None, home: Home = None) -> None:
    """Show one run: status, input, output, error, checkpoint, and the tokens its model calls used."""
    store = _workflow(database_url, home)
    run = store.get(run_id)
    table = Table("field", "value", show_header=False)
    for name in (
        "run_id",
        "workflow",
        "version",
        "status",
        "input",
        "output",
        "error",
        "parent_id",
        "created_at",
        "updated_at",
        "finished_at",
        "last_seq",
        "state_version",
        "cursor",
        "waiting",
    ):
        table.add_row(name, literal(getattr(run, name)))
    from statekeep.runtime.usage import run_usage

    table.add_row("usage", literal(str(run_usage(store.steps(run_id)))))
    console.print(table)


@runs_app.command("events")
def runs_events(run_id: str, database_url: DatabaseURL = None, home: Home = None) -> None:
    """The run's timeline: journal entries, tool calls and approvals, in order."""
    store = _workflow(database_url, home)
    store.get(run_id)
    rows: list[tuple[Any, str, str, str]] = []
    for s in store.steps(run_id):
        rows.append(
            (
                s.finished_at,
                f"{s.kind} #{s.seq}",
                s.name,
                f"attempt {s.attempt}, state v{s.state_version}, cursor {s.cursor}",
            )
        )
    for t in store.tool_calls(run_id):
        rows.append((t.started_at, f"tool #{t.seq}", t.tool, f"{t.status}, key {t.key}"))
    for a in store.approvals(status=None, run_id=run_id):
        rows.append((a.created_at, f"approval #{a.seq}", a.action, f"{a.status} by {a.decided_by or '-'}"))
    table = Table("time", "event", "name", "detail", title=literal(f"run {run_id}"))
    for at, kind, name, detail in sorted(rows, key=lambda r: r[0]):
        table.add_row(f"{at:%H:%M:%S.%f}"[:-3], literal(kind), literal(name), literal(detail))
    console.print(table)


@runs_app.command("cancel")
def runs_cancel(run_id: str, database_url: DatabaseURL = None, home: Home = None) -> None:
    """Cancel a live run; no worker will advance it again."""
    run = _workflow(database_url, home).cancel(run_id)
    _audit(database_url, home, "cancel", run.run_id)
    console.print(literal(f"run {run.run_id}: {run.status}"))


@runs_app.command("retry")
def runs_retry(run_id: str, database_url: DatabaseURL = None, home: Home = None) -> None:
    """Make a failed run runnable again: a worker continues it after its last completed step."""
    run = _workflow(database_url, home).retry(run_id)
    console.print(
        literal(f"run {run.run_id}: {run.status}; a worker continues it after step #{run.last_seq}")
    )


# --- approvals -------------------------------------------------------------------------------


@approvals_app.command("list")
def approvals_list(
    run: Annotated[str | None, typer.Option("--run", help="Only this run's approvals.")] = None,
    all_: Annotated[bool, typer.Option("--all", help="Decided ones too.")] = False,
    database_url: DatabaseURL = None,
    home: Home = None,
) -> None:
    """List approvals waiting for a decision (``--all`` for every one)."""
    table = Table("approval id", "run", "kind", "action", "arguments", "reason", "status", "expires")
    for a in _workflow(database_url, home).approvals(status=None if all_ else "pending", run_id=run):
        expires = "-" if a.expires_at is None else f"{a.expires_at:%Y-%m-%d %H:%M}"
        table.add_row(
            *map(literal, (a.approval_id, a.run_id, a.kind, a.action)),
            literal(json.dumps(a.args)),  # ASCII JSON: what the call will receive; homoglyphs show as \u
            *map(literal, (a.reason, a.status, expires)),
        )
    console.print(table)


By = Annotated[str, typer.Option("--by", help="Who decides (required, recorded).")]


@approvals_app.command("approve")
def approvals_approve(
    approval_id: str, by: By, comment: str | None = None, database_url: DatabaseURL = None, home: Home = None
) -> None:
    """Approve: the gated action may run, with exactly the arguments shown."""
    a = _workflow(database_url, home).decide(approval_id, approve=True, by=by, comment=comment)
    _audit(database_url, home, "approve", a.approval_id, {"run": a.run_id, "by": by})
    console.print(
        literal(f"approval {a.approval_id}: {a.status} by {a.decided_by}; run {a.run_id} can resume")
    )


@approvals_app.command("reject")
def approvals_reject(
    approval_id: str, by: By, comment: str | None = None, database_url: DatabaseURL = None, home: Home = None
) -> None:
    """Reject: the gated action will not run."""
    a = _workflow(database_url, home).decide(approval_id, approve=False, by=by, comment=comment)
    _audit(database_url, home, "reject", a.approval_id, {"run": a.run_id, "by": by})
    console.print(literal(f"approval {a.approval_id}: {a.status} by {a.decided_by}"))


# --- worker ----------------------------------------------------------------------------------


@app.command()
def worker(
    app_path: Annotated[
        str, typer.Option("--app", help="module:callable returning a Runtime (given Settings).")
    ],
    idle_exit: Annotated[float | None, typer.Option(help="Exit after this many idle seconds.")] = None,
    poll: float = 0.05,
    max_poll: float = 2.0,
    batch: int = 1,
    database_url: DatabaseURL = None,
    home: Home = None,
    memory_url: MemoryURL = None,
) -> None:
    """Run a worker loop: claim runnable runs under a lease and execute them (Ctrl-C stops)."""
    from statekeep.runtime import Runtime

    factory = _load(app_path)
    settings = _settings(database_url, home, memory_url)
    try:
        runtime = factory(settings)
    except StatekeepError:
        raise
    except Exception as exc:  # the application's own code failed to build its runtime
        raise InvalidInputError(f"{app_path!r} raised {exc!r}", field="--app") from exc
    if not isinstance(runtime, Runtime):
        raise InvalidInputError(
            f"{app_path!r} returned {type(runtime).__name__}, not a Runtime", field="--app"
        )
    try:
        handled = runtime.worker(poll=poll, max_poll=max_poll, batch=batch).run(idle_exit=idle_exit)
    finally:
        runtime.close()
    console.print(f"worker handled {handled} runs")


def _load(path: str) -> Callable[[Settings], Runtime]:
    module, _, attr = path.partition(":")
    if not module or not attr:
        raise InvalidInputError("expected module:callable", field="--app")
    try:
        target = getattr(importlib.import_module(module), attr)
    except (ImportError, AttributeError) as exc:
        raise InvalidInputError(f"cannot load {path!r}: {exc}", field="--app") from exc
    if not callable(target):
        raise InvalidInputError(f"{path!r} is not callable", field="--app")
    return target  # type: ignore[no-any-return]


# --- approval webhook ------------------------------------------------------------------------


@app.command()
def serve(
    tokens_file: Annotated[
        Path,
        typer.Option(
            "--tokens-file",
            envvar="STATEKEEP_WEB_TOKENS_FILE",
            help=(
                "JSON object of each person's identity and bearer token: "
                '{"alice@example.com": "...", "bob@example.com": {"token": "...", "gates": ["refund"], '
                '"owners": ["acme"]}} (gates and owners limit a token; leave them out for no limit).'
            ),
        ),
    ],
    host: str = "127.0.0.1",
    port: int = 8080,
    max_body: Annotated[
        int, typer.Option(envvar="STATEKEEP_WEB_MAX_BODY", help="Largest request body, in bytes (413 above).")
    ] = 64 * 1024,
    database_url: DatabaseURL = None,
    home: Home = None,
) -> None:
    """Serve the approval webhook: list, read and decide approvals over HTTP (needs statekeep[web])."""
    from statekeep._extras import requires

    with requires("web", "statekeep serve"):
        import uvicorn
    from statekeep._json import parse
    from statekeep.web import create_app

    try:
        tokens = parse(tokens_file.read_bytes(), str(tokens_file))
    except InvalidInputError as exc:
        raise InvalidInputError(str(exc), field="--tokens-file") from None
    if not isinstance(tokens, dict):
        raise InvalidInputError(f"{tokens_file} must hold a JSON object", field="--tokens-file")
    webhook = create_app(_workflow(database_url, home), tokens=tokens, max_body=max_body)
    uvicorn.run(webhook, host=host, port=port, log_level="info")


# --- memory ----------------------------------------------------------------------------------


@memory_app.command("search")
def memory_search(
    owner: str,
    query: str,
    k: int = 5,
    hybrid: Annotated[bool, typer.Option(help="Vector plus full-text search.")] = False,
    database_url: DatabaseURL = None,
    home: Home = None,
    memory_url: MemoryURL = None,
) -> None:
    """Search an owner's memories by meaning, with provenance."""
    with _memory(database_url, home, memory_url) as store:
        hits = store.search(owner, query, k=k, mode="hybrid" if hybrid else "vector")
    _audit(database_url, home, "read_memories", owner, {"results": len(hits)})
    table = Table("score", "memory", "kind", "source", "session", "run", "event", "id")
    for h in hits:
        m, p = h.memory, h.memory.provenance
        table.add_row(
            f"{h.score:.3f}",
            *map(literal, (m.content, m.kind, p.source, p.session_id, p.run_id, p.event_id, m.id)),
        )
    console.print(table)


@memory_app.command("add")
def memory_add(
    owner: str,
    content: str,
    kind: str = "semantic",
    tag: Annotated[list[str] | None, typer.Option(help="A tag (repeatable).")] = None,
    source: str = "user_supplied",
    database_url: DatabaseURL = None,
    home: Home = None,
    memory_url: MemoryURL = None,
) -> None:
    """Add a memory for an owner."""
    from statekeep.memory import Provenance

    with _memory(database_url, home, memory_url) as store:
        m = store.remember(owner, content, kind=kind, tags=tag or (), provenance=Provenance(source))  # type: ignore[arg-type]
    console.print(literal(f"remembered {m.id} for {owner}"))


@memory_app.command("forget")
def memory_forget(
    owner: str,
    memory_id: Annotated[str | None, typer.Option("--id", help="Forget only this memory.")] = None,
    yes: Annotated[bool, typer.Option("--yes", help="Do not ask for confirmation.")] = False,
    database_url: DatabaseURL = None,
    home: Home = None,
    memory_url: MemoryURL = None,
) -> None:
    """Erase an owner's memories (or one), leaving nothing recoverable; prints the receipt."""
    what = f"memory {memory_id} of {owner!r}" if memory_id else f"ALL memories of {owner!r}"
    if not yes and not typer.confirm(f"Erase {what}?"):
        raise typer.Abort()
    with _memory(database_url, home, memory_url) as store:
        receipt = store.forget_one(owner, memory_id) if memory_id else store.forget(owner)
    _audit(database_url, home, "forget_memories", owner, {"removed": receipt.removed})
    _print_json(json.dumps(receipt.as_dict(), ensure_ascii=False, indent=2))


@memory_app.command("export")
def memory_export(
    owner: str,
    out: Annotated[Path | None, typer.Option(help="Write to this file instead of stdout.")] = None,
    database_url: DatabaseURL = None,
    home: Home = None,
    memory_url: MemoryURL = None,
) -> None:
    """Export an owner's memories as JSON."""
    with _memory(database_url, home, memory_url) as store:
        data = store.export(owner)
    _audit(database_url, home, "export", owner, {"memories": int(json.loads(data)["count"])})
    if out is None:
        _print_json(data)
    else:
        out.write_text(data)
        console.print(literal(f"wrote {out}"))


@memory_app.command("reembed")
def memory_reembed(
    batch_size: int = 256, database_url: DatabaseURL = None, home: Home = None, memory_url: MemoryURL = None
) -> None:
    """Re-embed every memory stored by another embedding model, in batches."""
    with _memory(database_url, home, memory_url) as store, Progress(console=console) as progress:
        task = progress.add_task("re-embedding", total=None)
        n = store.reembed(
            batch_size=batch_size,
            progress=lambda done, total: progress.update(task, completed=done, total=total),
        )
    console.print(f"re-embedded {n} memories")


# --- context ---------------------------------------------------------------------------------


@context_app.command("show")
def context_show(
    session: str,
    budget: int = 8000,
    system: str | None = None,
    owner: Annotated[
        str | None, typer.Option(help="Refuse unless the session belongs to this owner.")
    ] = None,
    database_url: DatabaseURL = None,
    home: Home = None,
) -> None:
    """What the next model call of a session would see, its tokens per section, and its owner."""
    from statekeep.context import SQLContextStore
    from statekeep.keys import open_key_ring

    settings = _settings(database_url, home)
    store = SQLContextStore(settings.url_for("context"), keys=open_key_ring(settings))
    _opened(store.db)
    built = store.build(session, budget, system=system, compact=False, owner=owner)
    _audit(database_url, home, "read_context", session, {"messages": len(built.messages)})
    report = built.report
    table = Table(
        "section",
        "tokens",
        title=literal(f"session {session}: {report.total} of {report.budget} tokens ({report.counter})"),
    )
    console.print(f"owner: {store.owner_of(session) or '- (none recorded)'}", highlight=False)
    for name in ("system", "pinned", "memories", "summary", "window"):
        table.add_row(name, str(getattr(report, name)))
    console.print(table)
    for message in built.messages:
        console.print(Text.assemble((visible(message.role), "bold"), ": ", literal(message.content)))
        for call in message.tool_calls:
            arguments = json.dumps(dict(call.arguments), ensure_ascii=False)
            console.print(literal(f"  -> {call.name}({arguments}) [{call.id}]"))


# --- erasure, keys and the audit log ------------------------------------------------------------


@app.command()
def erase(
    owner: str,
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
    from statekeep.workflow import SQLWorkflowStore
    from statekeep.working import SQLWorkingStateStore

    if not yes and not typer.confirm(f"Erase EVERYTHING of owner {owner!r}, in every store?"):
        raise typer.Abort()
    settings = _settings(database_url, home, memory_url)
    keys = open_key_ring(settings)
    context = SQLContextStore(settings.url_for("context"), keys=keys)
    working = SQLWorkingStateStore(settings.url_for("working"), keys=keys)
    workflow = SQLWorkflowStore(settings.url_for("workflow"), keys=keys)
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
    log = AuditLog(settings.url_for("workflow"))
    log.record(_ACTOR.get("name") or getpass.getuser(), "erase", owner, via="cli", detail=receipt.counts())
    for store in (context, working, workflow, log, keys):
        if store is not None:
            store.db.dispose()
    console.print_json(json.dumps(receipt.as_dict()))


@app.command("audit")
def audit_list(
    limit: int = 100,
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

    log = AuditLog(_settings(database_url, home).url_for("workflow"))
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

    keys = open_key_ring(_settings(database_url, home))
    if keys is None:
        raise InvalidInputError("encryption is off (STATEKEEP_KEYS=none)", field="STATEKEEP_KEYS")
    new = keys.rotate()
    _audit(database_url, home, "rotate_keys", None, {"key_encryption_key": new})
    console.print(f"new writes use new data keys{f'; key-encryption key {new}' if new else ''}")
    keys.db.dispose()


@keys_app.command("reencrypt")
def keys_reencrypt(database_url: DatabaseURL = None, home: Home = None) -> None:
    """Seal again every value sealed under a retired data key, re-wrap old data keys, drop unused ones."""
    from statekeep.keys import open_key_ring, reencrypt

    settings = _settings(database_url, home)
    keys = open_key_ring(settings)
    if keys is None:
        raise InvalidInputError("encryption is off (STATEKEEP_KEYS=none)", field="STATEKEEP_KEYS")
    report = reencrypt(keys, {store: settings.url_for(store) for store in ("context", "working", "workflow")})
    _audit(database_url, home, "reencrypt", None, report)
    console.print_json(json.dumps(report))
    keys.db.dispose()


# --- database and demo -------------------------------------------------------------------------


@db_app.command("upgrade")
def db_upgrade(database_url: DatabaseURL = None, home: Home = None) -> None:
    """Create or upgrade every SQL store's tables (idempotent; safe from many workers)."""
    from statekeep.context import SQLContextStore
    from statekeep.workflow import SQLWorkflowStore
    from statekeep.working import SQLWorkingStateStore

    settings = _settings(database_url, home)
    for name, open_store in (
        ("context", SQLContextStore),
        ("working", SQLWorkingStateStore),
        ("workflow", SQLWorkflowStore),
    ):
        store = open_store(settings.url_for(name))
        console.print(f"{name}: up to date")
        store.db.dispose()
    from statekeep.audit import AuditLog
    from statekeep.keys import open_key_ring

    for name, extra in (("audit", AuditLog(settings.url_for("workflow"))), ("keys", open_key_ring(settings))):
        if extra is not None:
            console.print(f"{name}: up to date")
            extra.db.dispose()


@app.command()
def demo(database_url: DatabaseURL = None, home: Home = None, memory_url: MemoryURL = None) -> None:
    """Run the narrated demo on the embedded default (or --database-url)."""
    from statekeep import demo as demo_module

    demo_module.run(Settings.load(home=home, database_url=database_url, memory_url=memory_url), console)


# --- helpers ---------------------------------------------------------------------------------


def _status(value: str, kind: Any) -> Any:
    try:
        return kind(value)
    except ValueError:
        raise InvalidInputError(
            f"unknown status {value!r}; one of {[s.value for s in kind]}", field="--status"
        ) from None


# What a terminal would act on instead of showing: C0 and C1 control codes (but newline and tab),
# DEL, invisible formatting and bidi controls, and lone surrogates (no terminal encoding takes them).
_INVISIBLE = re.compile(
    "[\x00-\x08\x0b-\x1f\x7f-\x9f\u061c\u200b-\u200f\u2028-\u202e\u2060-\u206f"
    "\ufeff\ufff9-\ufffb\ud800-\udfff]"
)


def visible(text: str, *, json_text: bool = False) -> str:
    """``text`` with every character a terminal would act on, rather than show, written as an escape.

    ESC, CR and the other control codes, bidi overrides and zero-width characters
    become ``\\x1b``, ``\\r``, ``\\u202e``...; newlines, tabs and every printable
    character (any script, emoji) are kept. With ``json_text``, ``text`` is JSON and
    the escapes are JSON's own (``\\u001b``), so it stays JSON that decodes the same.
    """
    return _INVISIBLE.sub(_escape_json if json_text else _escape, text)


def _escape(match: re.Match[str]) -> str:
    code = ord(match.group())
    short = {0x09: "\\t", 0x0A: "\\n", 0x0D: "\\r"}.get(code)
    return short or (f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}")


def _escape_json(match: re.Match[str]) -> str:
    return f"\\u{ord(match.group()):04x}"


def literal(value: Any) -> Text:
    """A stored value for the terminal: never read as markup, control characters made visible.

    Every stored string the CLI prints (arguments, memories, context events, run
    errors, error messages) goes through here: a ``Text`` is never parsed for rich
    markup, so ``[conceal]`` or ``[/]`` print as they are. None is ``-``; other
    values are shown as JSON.
    """
    if value is None:
        return Text("-")
    text = value if isinstance(value, str) else json.dumps(value, default=str, ensure_ascii=False)
    return Text(visible(text))


def _print_json(text: str) -> None:
    """JSON text as it is (highlighted on a terminal), with JSON's own escapes for control characters.

    Not ``print_json``, which decodes and re-encodes: that would bring back what
    :func:`visible` escaped.
    """
    console.print(JSONHighlighter()(Text(visible(text, json_text=True))), soft_wrap=True)


def main() -> None:
    """Entry point: a StatekeepError prints one line and exits 1, without a traceback."""
    import os

    os.environ.setdefault("HF_HUB_OFFLINE", "1")  # models come from installed packages, never a hub
    os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")
    try:
        app(standalone_mode=False)
    except (StatekeepError, OSError) as exc:  # OSError: a file the user named cannot be written or read
        err_console.print(literal(f"error: {exc}"), soft_wrap=True)
        raise SystemExit(1) from None
    except (typer.Abort, KeyboardInterrupt):
        err_console.print("aborted")
        raise SystemExit(1) from None
    except typer.Exit as exc:
        raise SystemExit(exc.exit_code) from None
    except typer.TyperException as exc:  # usage errors: a missing --by, an unknown option
        show = getattr(exc, "show", None)
        if callable(show):
            show()
        else:
            err_console.print(literal(f"error: {exc}"), soft_wrap=True)
        raise SystemExit(int(getattr(exc, "exit_code", 2))) from None
    finally:
        while _OPENED:
            _OPENED.pop().dispose()
