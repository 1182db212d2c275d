"""The ``statekeep`` command line: runs, approvals, workers, memory, context, the console, the demo.

Every command reads the same settings as the library (``--database-url``,
``--memory-url``, ``--home`` or the ``STATEKEEP_*`` environment). A failure
prints a one-line reason and exits non-zero, without a traceback; an unknown
id is a failure. Commands that only read never create a database, a schema or
a folder: a missing one is an error naming its setting. Listings are newest
first, a page at a time, say how many there are in all, print ids in full, and
print JSON with ``--json``. Commands that act on a run, an approval or a
person's data are recorded in the audit log under ``statekeep --as NAME``
(``STATEKEEP_ACTOR``; default: the OS user).
"""

from __future__ import annotations

import getpass
import importlib
import json
import os
import sys
from collections.abc import Callable, Mapping
from dataclasses import asdict
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer
from rich.console import Console
from rich.highlighter import JSONHighlighter
from rich.progress import Progress
from rich.table import Table
from rich.text import Text

from statekeep._inspect import open_memory, open_sql, pretty, visible
from statekeep.config import Settings
from statekeep.errors import InvalidInputError, StatekeepError

if TYPE_CHECKING:
    from statekeep.audit import Action
    from statekeep.db import Database
    from statekeep.memory import Embedder, MemoryStore
    from statekeep.runtime import Agent, Runtime
    from statekeep.workflow import Approval, Run, WorkflowStore

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
    str | None,
    typer.Option(
        "--database-url",
        envvar="STATEKEEP_DATABASE_URL",
        help="URL of the SQL stores (default: sqlite:///<home>/statekeep.db).",
    ),
]
MemoryURL = Annotated[
    str | None,
    typer.Option(
        "--memory-url",
        envvar="STATEKEEP_MEMORY_URL",
        help="Memory folder (LanceDB) or postgresql:// URL (default: <home>/memory).",
    ),
]
Home = Annotated[
    str | None,
    typer.Option("--home", envvar="STATEKEEP_HOME", help="Embedded data folder (default: .statekeep)."),
]
JSONOut = Annotated[bool, typer.Option("--json", help="Print JSON instead of a table.")]
EmbedderOption = Annotated[
    str | None,
    typer.Option(
        "--embedder",
        help="module:attr of the Embedder the memories were written with (an instance, or a callable "
        "returning one); default: all-MiniLM-L6-v2, as the runtime's default.",
    ),
]
RunID = Annotated[str, typer.Argument(help="The run's id.", show_default=False)]
Owner = Annotated[str, typer.Argument(help="Whose memories: the owner's id.", show_default=False)]


def _version(value: bool) -> None:
    if value:
        from statekeep import __version__

        console.print(f"statekeep {__version__}", highlight=False)
        raise typer.Exit()


#: who runs this command, for the audit log (``--as``)
_ACTOR: dict[str, str] = {}


@app.callback()
def _root(
    version: Annotated[
        bool,
        typer.Option("--version", help="Print the version and exit.", is_eager=True, callback=_version),
    ] = False,
    as_: Annotated[
        str | None,
        typer.Option("--as", envvar="STATEKEEP_ACTOR", help="Who you are, for the audit log."),
    ] = None,
) -> None:
    """Durable state for AI agents."""
    _ACTOR["name"] = as_ or getpass.getuser()


# --- opening stores --------------------------------------------------------------------------


def _load_settings(database_url: str | None, home: str | None, memory_url: str | None = None) -> Settings:
    """The settings, unchecked: nothing is connected to or created."""
    return Settings.load(home=home, database_url=database_url, memory_url=memory_url)


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
    """The settings, with every server reached (and the memory folder created) once."""
    settings = _load_settings(database_url, home, memory_url)
    settings.check()
    return settings


#: Databases a command opened; main() closes their connections when the command ends, so a
#: PostgreSQL server sees them closed, not dropped (and an in-process caller leaks none).
_OPENED: list[Database] = []


def _opened(db: Database) -> Database:
    _OPENED.append(db)
    return db


def _workflow(database_url: str | None, home: str | None) -> WorkflowStore:
    """The workflow store of an existing database (nothing is created), with the key ring."""
    from statekeep.keys import open_key_ring
    from statekeep.workflow import SQLWorkflowStore

    settings = _load_settings(database_url, home)
    db = _opened(open_sql(settings, "workflow"))
    return SQLWorkflowStore(db, keys=open_key_ring(settings, db))


def _memory(
    database_url: str | None,
    home: str | None,
    memory_url: str | None,
    *,
    read_only: bool = False,
    embedder: str | None = None,
) -> MemoryStore:
    settings = _load_settings(database_url, home, memory_url)
    chosen = None if embedder is None else _embedder(embedder)
    if read_only:  # a LanceDB folder is read beside a worker that writes it; nothing is created
        return open_memory(settings, chosen, read_only=True)
    from statekeep.memory import open_memory_store

    settings.check()
    return open_memory_store(settings.memory_url, chosen)


# --- runs ------------------------------------------------------------------------------------


@runs_app.command("list")
def runs_list(
    status: Annotated[str | None, typer.Option(help="Only runs in this status.")] = None,
    workflow: Annotated[str | None, typer.Option(help="Only runs of this workflow (agent.<name>).")] = None,
    owner: Annotated[str | None, typer.Option(help="Only the agent runs of this owner.")] = None,
    search: Annotated[
        str | None, typer.Option(help="Only runs whose id, workflow, input or error contains this text.")
    ] = None,
    limit: Annotated[int, typer.Option(help="Runs per page (at most 1000).")] = 50,
    offset: Annotated[int, typer.Option(help="Skip this many (newer) runs: the next page.")] = 0,
    json_out: JSONOut = False,
    database_url: DatabaseURL = None,
    home: Home = None,
) -> None:
    """List runs, newest first, a page at a time; the total and the next page are shown."""
    from statekeep.workflow import RunStatus
    from statekeep.workflow.base import run_owner

    wanted = None if status is None else _status(status, RunStatus)
    page = _workflow(database_url, home).search_runs(
        status=wanted, workflow=workflow, owner=owner, text=search, limit=limit, offset=offset
    )
    if json_out:
        doc = {
            "total": page.total,
            "offset": page.offset,
            "limit": page.limit,
            "counts": page.counts,
            "runs": [_run_json(r) for r in page.runs],
        }
        _print_json(json.dumps(doc, ensure_ascii=False, indent=2, default=str))
        return
    table = Table(
        "run id", "workflow", "owner", "status", "steps", "created", "updated", caption_justify="left"
    )
    _keep_whole(table, 0, [r.run_id for r in page.runs])
    for run in page.runs:
        table.add_row(
            literal(run.run_id),
            literal(f"{run.workflow} v{run.version}"),
            literal(run_owner(run)),
            literal(run.status),
            str(run.last_seq),
            f"{run.created_at:%Y-%m-%d %H:%M:%S}",
            f"{run.updated_at:%Y-%m-%d %H:%M:%S}",
        )
    shown = len(page.runs)
    if page.total == 0:
        table.caption = "no runs" + (" match these filters" if page.counts or offset else "")
    else:
        first = offset + 1 if shown else offset
        table.caption = f"runs {first}-{offset + shown} of {page.total}, newest first"
        if offset + shown < page.total:
            table.caption += f"; next page: --offset {offset + shown}"
    _show(table)


@runs_app.command("show")
def runs_show(
    run_id: RunID, json_out: JSONOut = False, database_url: DatabaseURL = None, home: Home = None
) -> None:
    """Show one run: status, owner, input, output, error, checkpoint, what it waits for, and the
    tokens its model calls used."""
    from statekeep.runtime.usage import run_usage

    store = _workflow(database_url, home)
    run = store.get(run_id)
    usage = run_usage(store.steps(run_id))
    doc = _run_json(run)
    doc["usage"] = {**asdict(usage), "total": usage.total} if json_out else str(usage)
    if json_out:
        _print_json(json.dumps(doc, ensure_ascii=False, indent=2, default=str))
        return
    table = Table("field", "value", show_header=False)
    for name, value in doc.items():
        table.add_row(name, literal(value))
    console.print(table)


@runs_app.command("events")
def runs_events(
    run_id: RunID, json_out: JSONOut = False, database_url: DatabaseURL = None, home: Home = None
) -> None:
    """The run's timeline: steps, model and tool calls (with idempotency keys), retries, waits,
    approvals and child runs, in order."""
    from statekeep._inspect import timeline

    store = _workflow(database_url, home)
    entries = timeline(store, store.get(run_id))
    if json_out:
        rows = [{"at": e.at, "kind": e.kind, "seq": e.seq, "name": e.name, "detail": e.detail,
                 "status": e.status, **e.data} for e in entries]  # fmt: skip
        _print_json(json.dumps(rows, ensure_ascii=False, indent=2, default=str))
        return
    table = Table("time", "seq", "event", "name", "status", "detail", title=literal(f"run {run_id}"))
    for e in entries:
        at = f"{e.at:%H:%M:%S.%f}"[:-3]
        seq = "-" if e.seq is None else str(e.seq)
        table.add_row(at, seq, literal(e.kind), literal(e.name), literal(e.status), literal(e.detail))
    console.print(table)


@runs_app.command("cancel")
def runs_cancel(run_id: RunID, database_url: DatabaseURL = None, home: Home = None) -> None:
    """Cancel a live run; no worker will advance it again."""
    run = _workflow(database_url, home).cancel(run_id)
    _audit(database_url, home, "cancel", run.run_id)
    console.print(literal(f"run {run.run_id}: {run.status}"))


@runs_app.command("retry")
def runs_retry(run_id: RunID, database_url: DatabaseURL = None, home: Home = None) -> None:
    """Make a failed run runnable again: a worker continues it after its last completed step."""
    run = _workflow(database_url, home).retry(run_id)
    console.print(
        literal(f"run {run.run_id}: {run.status}; a worker continues it after step #{run.last_seq}")
    )


def _run_json(run: Run) -> dict[str, Any]:
    from statekeep.workflow.base import run_owner

    return {
        "run_id": run.run_id,
        "workflow": run.workflow,
        "version": run.version,
        "status": run.status.value,
        "owner": run_owner(run),
        "input": run.input,
        "output": run.output,
        "error": run.error,
        "parent_id": run.parent_id,
        "created_at": run.created_at,
        "updated_at": run.updated_at,
        "finished_at": run.finished_at,
        "last_seq": run.last_seq,
        "state_version": run.state_version,
        "cursor": run.cursor,
        "waiting": run.waiting,
    }


# --- approvals -------------------------------------------------------------------------------


@approvals_app.command("list")
def approvals_list(
    run: Annotated[str | None, typer.Option("--run", help="Only this run's approvals.")] = None,
    all_: Annotated[bool, typer.Option("--all", help="Decided ones too.")] = False,
    json_out: JSONOut = False,
    database_url: DatabaseURL = None,
    home: Home = None,
) -> None:
    """List approvals waiting for a decision, oldest first (``--all`` for every one), ids in full."""
    store = _workflow(database_url, home)
    if run is not None:
        store.get(run)  # an unknown run is an error, not an empty list
    found = store.approvals(status=None if all_ else "pending", run_id=run)
    if json_out:
        _print_json(json.dumps([_approval_json(a) for a in found], ensure_ascii=False, indent=2, default=str))
        return
    table = Table("approval id", "run", "kind", "action", "arguments", "reason", "status", "expires")
    _keep_whole(table, 0, [a.approval_id for a in found])
    _keep_whole(table, 1, [a.run_id for a in found])
    for a in found:
        expires = "-" if a.expires_at is None else f"{a.expires_at:%Y-%m-%d %H:%M}"
        table.add_row(
            *map(literal, (a.approval_id, a.run_id, a.kind, a.action)),
            literal(json.dumps(a.args)),  # ASCII JSON: what the call will receive; homoglyphs show as \u
            *map(literal, (a.reason, a.status, expires)),
        )
    table.caption = f"{len(found)} {'approvals' if all_ else 'pending'}"
    _show(table)


def _approval_json(a: Approval) -> dict[str, Any]:
    return {
        "approval_id": a.approval_id,
        "run_id": a.run_id,
        "kind": a.kind,
        "action": a.action,
        "args": a.args,
        "reason": a.reason,
        "status": a.status,
        "created_at": a.created_at,
        "expires_at": a.expires_at,
        "decided_by": a.decided_by,
        "decided_at": a.decided_at,
        "comment": a.comment,
    }


ApprovalID = Annotated[
    str, typer.Argument(help="The approval's id (approvals list shows it).", show_default=False)
]
By = Annotated[str, typer.Option("--by", help="Who decides (required, recorded).")]
Comment = Annotated[str | None, typer.Option(help="Why; recorded with the decision.")]


@approvals_app.command("approve")
def approvals_approve(
    approval_id: ApprovalID,
    by: By,
    comment: Comment = None,
    database_url: DatabaseURL = None,
    home: Home = None,
) -> None:
    """Approve: the gated action may run, with exactly the arguments shown."""
    a = _decide(approval_id, True, by, comment, database_url, home)
    _audit(database_url, home, "approve", a.approval_id, {"run": a.run_id, "by": by})
    console.print(
        literal(f"approval {a.approval_id}: {a.status} by {a.decided_by}; run {a.run_id} can resume")
    )


@approvals_app.command("reject")
def approvals_reject(
    approval_id: ApprovalID,
    by: By,
    comment: Comment = None,
    database_url: DatabaseURL = None,
    home: Home = None,
) -> None:
    """Reject: the gated action will not run."""
    a = _decide(approval_id, False, by, comment, database_url, home)
    _audit(database_url, home, "reject", a.approval_id, {"run": a.run_id, "by": by})
    console.print(literal(f"approval {a.approval_id}: {a.status} by {a.decided_by}"))


def _decide(
    approval_id: str, approve: bool, by: str, comment: str | None, database_url: str | None, home: str | None
) -> Approval:
    from statekeep import tracing

    store = _workflow(database_url, home)
    decided = store.decide(approval_id, approve=approve, by=by, comment=comment)
    tracing.approval_decided(decided, store.find(decided.run_id), via="cli")
    return decided


# --- worker ----------------------------------------------------------------------------------

LogLevel = Annotated[
    str, typer.Option("--log-level", help="Log records at this level and above: DEBUG, INFO, WARNING, ERROR.")
]
LogFormat = Annotated[
    str, typer.Option("--log-format", help="Logs as text lines, or one JSON object per line.")
]


@app.command()
def worker(
    app_path: Annotated[
        str,
        typer.Option(
            "--app",
            help="module:callable returning a Runtime (given Settings); the module is found from the "
            "current folder too.",
        ),
    ],
    idle_exit: Annotated[float | None, typer.Option(help="Exit after this many idle seconds.")] = None,
    poll: Annotated[float, typer.Option(help="Seconds between claims when there was work.")] = 0.05,
    max_poll: Annotated[float, typer.Option(help="Longest wait between claims when idle (seconds).")] = 2.0,
    batch: Annotated[int, typer.Option(help="Runs claimed at once.")] = 1,
    log_level: LogLevel = "INFO",
    log_format: LogFormat = "text",
    database_url: DatabaseURL = None,
    home: Home = None,
    memory_url: MemoryURL = None,
) -> None:
    """Run a worker loop: claim runnable runs under a lease and execute them (Ctrl-C stops).

    Logs (to stderr) a line per run claimed, step completed, wait, retry,
    failure and lease lost, with the run id, step and worker as fields.
    """
    from statekeep.runtime import Runtime

    factory = _factory(app_path, "--app")
    settings = _settings(database_url, home, memory_url)
    _configure_logs(log_level, log_format)
    try:
        runtime = factory(settings)
    except StatekeepError:
        _unconfigure_logs()
        raise
    except Exception as exc:  # the application's own code failed to build its runtime
        _unconfigure_logs()
        raise InvalidInputError(f"{app_path!r} raised {exc!r}", field="--app") from exc
    if not isinstance(runtime, Runtime):
        _unconfigure_logs()
        raise InvalidInputError(
            f"{app_path!r} returned {type(runtime).__name__}, not a Runtime", field="--app"
        )
    try:
        handled = runtime.worker(poll=poll, max_poll=max_poll, batch=batch).run(idle_exit=idle_exit)
    finally:
        runtime.close()
        _unconfigure_logs()
    console.print(f"worker handled {handled} runs")


def _unconfigure_logs() -> None:
    from statekeep import logs

    logs.unconfigure()


def _configure_logs(level: str, fmt: str) -> None:
    from statekeep import logs

    try:
        logs.configure(level, fmt)  # type: ignore[arg-type]
    except ValueError as exc:
        raise InvalidInputError(
            str(exc), field="--log-format" if "format" in str(exc) else "--log-level"
        ) from None


def _load(path: str, option: str) -> Any:
    """``module:attr``, the module found on the path or in the current folder (as ``python -m`` would)."""
    module, _, attr = path.partition(":")
    if not module or not attr:
        raise InvalidInputError("expected module:attr", field=option)
    here = os.getcwd()
    if here not in sys.path and "" not in sys.path:
        sys.path.insert(0, here)
    try:
        target = importlib.import_module(module)
        for part in attr.split("."):
            target = getattr(target, part)
    except (ImportError, AttributeError) as exc:
        raise InvalidInputError(f"cannot load {path!r}: {exc}", field=option) from exc
    return target


def _factory(path: str, option: str) -> Callable[[Settings], Runtime]:
    target = _load(path, option)
    if not callable(target):
        raise InvalidInputError(f"{path!r} is not callable", field=option)
    return target  # type: ignore[no-any-return]


def _embedder(path: str) -> Embedder:
    from statekeep.memory.embedders import is_embedder

    target = _load(path, "--embedder")
    if isinstance(target, type) or (not is_embedder(target) and callable(target)):
        target = target()
    if not is_embedder(target):
        raise InvalidInputError(f"{path!r} is not an Embedder (name, dimension, embed)", field="--embedder")
    return target  # type: ignore[no-any-return]


def _agent(path: str) -> Agent:
    from statekeep.runtime import Agent

    target = _load(path, "--agent")
    if not isinstance(target, Agent) and callable(target) and not isinstance(target, type):
        target = target()
    if not isinstance(target, Agent):
        raise InvalidInputError(f"{path!r} is not an Agent", field="--agent")
    return target


# --- the console and approval webhook --------------------------------------------------------


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
    host: Annotated[str, typer.Option(help="Address to listen on.")] = "127.0.0.1",
    port: Annotated[int, typer.Option(help="Port to listen on.")] = 8080,
    max_body: Annotated[
        int, typer.Option(envvar="STATEKEEP_WEB_MAX_BODY", help="Largest request body, in bytes (413 above).")
    ] = 64 * 1024,
    embedder: EmbedderOption = None,
    ssl_certfile: Annotated[
        Path | None, typer.Option(help="TLS certificate (PEM): serve HTTPS, as the login cookie is Secure.")
    ] = None,
    ssl_keyfile: Annotated[Path | None, typer.Option(help="TLS private key (PEM) of --ssl-certfile.")] = None,
    log_level: LogLevel = "INFO",
    log_format: LogFormat = "text",
    database_url: DatabaseURL = None,
    home: Home = None,
    memory_url: MemoryURL = None,
) -> None:
    """Serve the web console and the approval API (needs the web extra of statekeep).

    Pages for runs, approvals and memory at /, the JSON API under /api
    (documented at /docs), all behind the same tokens.
    """
    from statekeep._extras import requires

    with requires("web", "statekeep serve"):
        import uvicorn
    from statekeep._json import parse
    from statekeep.web import Stores, check_config, create_app

    _configure_logs(log_level, log_format)
    try:
        tokens = parse(tokens_file.read_bytes(), str(tokens_file))
    except InvalidInputError as exc:
        raise InvalidInputError(str(exc), field="--tokens-file") from None
    if not isinstance(tokens, dict):
        raise InvalidInputError(f"{tokens_file} must hold a JSON object", field="--tokens-file")
    check_config(tokens, max_body)  # before any store is opened
    settings = _load_settings(database_url, home, memory_url)
    stores = Stores.open(settings, embedder=None if embedder is None else _embedder(embedder))
    webhook = create_app(stores.workflow, tokens=tokens, max_body=max_body, stores=stores)
    console.print(f"statekeep console on http{'s' if ssl_certfile else ''}://{host}:{port}/", highlight=False)
    try:
        uvicorn.run(
            webhook,
            host=host,
            port=port,
            log_config=None,
            ssl_certfile=None if ssl_certfile is None else str(ssl_certfile),
            ssl_keyfile=None if ssl_keyfile is None else str(ssl_keyfile),
        )
    finally:
        stores.close()
        _unconfigure_logs()


# --- memory ----------------------------------------------------------------------------------


@memory_app.command("search")
def memory_search(
    owner: Owner,
    query: Annotated[str, typer.Argument(help="What to look for, in words.", show_default=False)],
    k: Annotated[int, typer.Option(help="How many memories at most.")] = 5,
    hybrid: Annotated[
        bool, typer.Option(help="Vector plus full-text search (the default); --no-hybrid: by meaning alone.")
    ] = True,
    embedder: EmbedderOption = None,
    json_out: JSONOut = False,
    database_url: DatabaseURL = None,
    home: Home = None,
    memory_url: MemoryURL = None,
) -> None:
    """Search an owner's memories by meaning, with provenance (works while a worker writes)."""
    with _memory(database_url, home, memory_url, read_only=True, embedder=embedder) as store:
        hits = store.search(owner, query, k=k, mode="hybrid" if hybrid else "vector")
    _audit(database_url, home, "read_memories", owner, {"results": len(hits)})
    if json_out:
        doc = [{"score": h.score, **h.memory.as_dict()} for h in hits]
        _print_json(json.dumps(doc, ensure_ascii=False, indent=2))
        return
    table = Table("score", "memory", "kind", "source", "session", "run", "event", "id")
    _keep_whole(table, 7, [h.memory.id for h in hits])
    for h in hits:
        m, p = h.memory, h.memory.provenance
        table.add_row(
            f"{h.score:.3f}",
            *map(literal, (m.content, m.kind, p.source, p.session_id, p.run_id, p.event_id, m.id)),
        )
    table.caption = f"{len(hits)} found"
    _show(table)


@memory_app.command("list")
def memory_list(
    owner: Owner,
    json_out: JSONOut = False,
    database_url: DatabaseURL = None,
    home: Home = None,
    memory_url: MemoryURL = None,
) -> None:
    """Every memory of an owner, newest first, superseded and duplicates included, with provenance."""
    with _memory(database_url, home, memory_url, read_only=True) as store:
        memories = list(reversed(store.list_memories(owner)))
    if json_out:
        _print_json(json.dumps([m.as_dict() for m in memories], ensure_ascii=False, indent=2))
        return
    table = Table("created", "memory", "kind", "source", "trust", "run", "id", "state")
    _keep_whole(table, 6, [m.id for m in memories])
    for m in memories:
        state = "current" if m.is_current else ("superseded" if m.superseded_by else "duplicate")
        table.add_row(
            f"{m.created_at:%Y-%m-%d %H:%M}",
            *map(literal, (m.content, m.kind, m.provenance.source)),
            f"{m.trust:.2f}",
            *map(literal, (m.provenance.run_id, m.id, state)),
        )
    table.caption = f"{len(memories)} memories of {visible(owner)}"
    _show(table)


@memory_app.command("add")
def memory_add(
    owner: Owner,
    content: Annotated[str, typer.Argument(help="The memory, in words.", show_default=False)],
    kind: Annotated[str, typer.Option(help="semantic, episodic or procedural.")] = "semantic",
    tag: Annotated[list[str] | None, typer.Option(help="A tag (repeatable).")] = None,
    source: Annotated[
        str,
        typer.Option(help="Where it came from: user_supplied, agent_inferred, system_verified, imported."),
    ] = "user_supplied",
    embedder: EmbedderOption = None,
    database_url: DatabaseURL = None,
    home: Home = None,
    memory_url: MemoryURL = None,
) -> None:
    """Add a memory for an owner."""
    from statekeep.memory import Provenance

    with _memory(database_url, home, memory_url, embedder=embedder) as store:
        m = store.remember(owner, content, kind=kind, tags=tag or (), provenance=Provenance(source))  # type: ignore[arg-type]
    console.print(literal(f"remembered {m.id} for {owner}"))


@memory_app.command("forget")
def memory_forget(
    owner: Owner,
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
    owner: Owner,
    out: Annotated[Path | None, typer.Option(help="Write to this file instead of stdout.")] = None,
    database_url: DatabaseURL = None,
    home: Home = None,
    memory_url: MemoryURL = None,
) -> None:
    """Export an owner's memories as JSON (works while a worker writes)."""
    with _memory(database_url, home, memory_url, read_only=True) as store:
        data = store.export(owner)
    _audit(database_url, home, "export", owner, {"memories": int(json.loads(data)["count"])})
    if out is None:
        _print_json(data)
    else:
        out.write_text(data)
        console.print(literal(f"wrote {out}"))


@memory_app.command("reembed")
def memory_reembed(
    batch_size: Annotated[int, typer.Option(help="Memories embedded per batch.")] = 256,
    embedder: EmbedderOption = None,
    database_url: DatabaseURL = None,
    home: Home = None,
    memory_url: MemoryURL = None,
) -> None:
    """Re-embed every memory stored by another embedding model, in batches."""
    with (
        _memory(database_url, home, memory_url, embedder=embedder) as store,
        Progress(console=console) as progress,
    ):
        task = progress.add_task("re-embedding", total=None)
        n = store.reembed(
            batch_size=batch_size,
            progress=lambda done, total: progress.update(task, completed=done, total=total),
        )
    console.print(f"re-embedded {n} memories")


# --- context ---------------------------------------------------------------------------------


@context_app.command("show")
def context_show(
    session: Annotated[str, typer.Argument(help="The session's id (an agent run's id, by default).")],
    agent: Annotated[
        str | None,
        typer.Option(
            help="module:attr of the Agent (or a callable returning it): its system prompt, budget and "
            "number of memories. Default: as the run's last model call was sent."
        ),
    ] = None,
    budget: Annotated[int | None, typer.Option(help="Token budget (overrides the agent's).")] = None,
    system: Annotated[str | None, typer.Option(help="System prompt (overrides the agent's).")] = None,
    memories: Annotated[
        int | None, typer.Option(help="Memories to retrieve (overrides the agent's).")
    ] = None,
    owner: Annotated[
        str | None, typer.Option(help="Refuse unless the session belongs to this owner.")
    ] = None,
    embedder: EmbedderOption = None,
    json_out: JSONOut = False,
    database_url: DatabaseURL = None,
    home: Home = None,
    memory_url: MemoryURL = None,
) -> None:
    """Exactly what the runtime would send the model next: system prompt, pinned task state,
    memories, summary and window, with tokens per section."""
    from statekeep._inspect import find_sql, next_context
    from statekeep.context import SQLContextStore
    from statekeep.errors import SessionOwnerError
    from statekeep.keys import open_key_ring
    from statekeep.workflow import SQLWorkflowStore
    from statekeep.working import SQLWorkingStateStore

    settings = _load_settings(database_url, home, memory_url)
    context_db = _opened(open_sql(settings, "context"))
    workflow_db, working_db = find_sql(settings, "workflow"), find_sql(settings, "working")
    keys = None if workflow_db is None else open_key_ring(settings, workflow_db)
    context = SQLContextStore(context_db, keys=keys)
    found_owner = context.owner_of(session)
    if owner is not None and found_owner not in (None, owner):
        raise SessionOwnerError(session, owner, found_owner)
    chosen = None if embedder is None else _embedder(embedder)
    built = next_context(
        session_id=session,
        context=context,
        workflow=None if workflow_db is None else SQLWorkflowStore(_opened(workflow_db), keys=keys),
        working=None if working_db is None else SQLWorkingStateStore(_opened(working_db), keys=keys),
        memory=lambda: open_memory(settings, chosen, read_only=True),
        agent=None if agent is None else _agent(agent),
        system=system,
        budget=budget,
        memory_k=memories,
    )
    record = built.record
    _audit(database_url, home, "read_context", session, {"owner": built.owner})
    if json_out:
        doc = {
            "session_id": session,
            "owner": built.owner,
            "run_id": None if built.run is None else built.run.run_id,
            "settings_from": built.source,
            "notes": built.notes,
            **record,
        }
        _print_json(json.dumps(doc, ensure_ascii=False, indent=2))
        return
    run = "-" if built.run is None else f"{built.run.run_id} ({built.run.status.value})"
    console.print(literal(f"session: {session}"))
    console.print(literal(f"owner: {built.owner or '- (none recorded)'}"))
    console.print(literal(f"run: {run}"))
    console.print(literal(f"agent settings from {built.source}"))
    for note in built.notes:
        console.print(literal(f"note: {note}"))
    title = f"{record['total']} of {record['budget']} tokens ({record['counter']}), next model call"
    table = Table("section", "tokens", "messages", title=literal(title))
    sections = {s["name"]: s for s in record["sections"]}
    for name in ("system", "pinned", "memories", "summary", "window"):
        s = sections.get(name, {"tokens": 0, "messages": []})
        table.add_row(name, str(s["tokens"]), str(len(s["messages"])))
    table.add_row("reply overhead", str(record["reply_overhead"]), "")
    console.print(table)
    for s in record["sections"]:
        console.rule(literal(f"{s['name']} ({s['tokens']} tokens)"), align="left")
        for message in s["messages"]:
            console.print(
                Text.assemble((visible(message["role"]), "bold"), ": ", literal(message["content"]))
            )
            for call in message.get("tool_calls") or ():
                arguments = json.dumps(call.get("arguments") or {}, ensure_ascii=False)
                console.print(literal(f"  -> {call['name']}({arguments}) [{call['id']}]"))


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
    from statekeep.workflow import SQLWorkflowStore
    from statekeep.working import SQLWorkingStateStore

    if not yes and not typer.confirm(f"Erase EVERYTHING of owner {owner!r}, in every store?"):
        raise typer.Abort()
    settings = _settings(database_url, home, memory_url)
    keys = open_key_ring(settings)
    context = SQLContextStore(settings.url_for("context"), keys=keys)
    working = SQLWorkingStateStore(settings.url_for("working"), keys=keys)
    workflow = SQLWorkflowStore(settings.url_for("workflow"), keys=keys)
    log = AuditLog(settings.url_for("workflow"))
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
        actor = _ACTOR.get("name") or getpass.getuser()
        log.record(actor, "erase", owner, via="cli", detail=receipt.counts())
    finally:
        for store in (context, working, workflow, log, keys):
            if store is not None:
                store.db.dispose()
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


# --- helpers ---------------------------------------------------------------------------------


def _status(value: str, kind: Any) -> Any:
    try:
        return kind(value)
    except ValueError:
        raise InvalidInputError(
            f"unknown status {value!r}; one of {[s.value for s in kind]}", field="--status"
        ) from None


def _keep_whole(table: Table, column: int, values: list[str]) -> None:
    """Never cut or wrap the ids of ``column``: they are what the other commands need."""
    col = table.columns[column]
    col.no_wrap, col.overflow = True, "fold"
    col.min_width = max([len(visible(v)) for v in values] + [len(str(col.header))])


def _show(table: Table) -> None:
    """The table; or, when the terminal is too narrow to show its ids whole, one block per row."""
    needed = sum((c.min_width or min(len(str(c.header)), 8)) + 3 for c in table.columns) + 1
    if needed <= console.width:
        console.print(table)
        return
    headers = [str(c.header) for c in table.columns]
    for row in zip(*(list(c.cells) for c in table.columns), strict=True):
        first: Any = row[0]
        console.print(Text.assemble((f"{headers[0]}: ", "bold"), first), soft_wrap=True)
        for header, cell in zip(headers[1:], row[1:], strict=True):
            value: Any = cell
            console.print(Text.assemble(f"  {header}: ", value), soft_wrap=True)
    if table.caption:
        console.print(table.caption, highlight=False)


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


__all__ = ["app", "literal", "main", "pretty", "visible"]
