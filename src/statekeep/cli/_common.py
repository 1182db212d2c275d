"""What every command shares: the apps, the options, opening stores, and printing."""

from __future__ import annotations

import getpass
import importlib
import json
import os
import sys
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Annotated, Any

import typer
from rich.console import Console
from rich.highlighter import JSONHighlighter
from rich.table import Table
from rich.text import Text

from statekeep._literal import visible
from statekeep._open import open_memory, open_sql
from statekeep.config import Settings
from statekeep.errors import InvalidInputError

if TYPE_CHECKING:
    from statekeep.audit import Action
    from statekeep.db import Database
    from statekeep.memory import Embedder, MemoryStore
    from statekeep.runtime import Agent, Runtime
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
ACTOR: dict[str, str] = {}


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
    ACTOR["name"] = as_ or getpass.getuser()


# --- opening stores --------------------------------------------------------------------------


def load_settings(database_url: str | None, home: str | None, memory_url: str | None = None) -> Settings:
    """The settings, unchecked: nothing is connected to or created."""
    return Settings.load(home=home, database_url=database_url, memory_url=memory_url)


def record_audit(
    database_url: str | None,
    home: str | None,
    action: Action,
    target: str | None,
    detail: Mapping[str, int | str | bool | None] | None = None,
) -> None:
    """Record a command in the audit log (never the content it showed or changed)."""
    from statekeep.audit import AuditLog

    log = AuditLog(checked_settings(database_url, home).url_for("workflow"))
    try:
        log.record(ACTOR.get("name") or getpass.getuser(), action, target, via="cli", detail=detail)
    finally:
        log.db.dispose()


def checked_settings(database_url: str | None, home: str | None, memory_url: str | None = None) -> Settings:
    """The settings, with every server reached (and the memory folder created) once."""
    settings = load_settings(database_url, home, memory_url)
    settings.check()
    return settings


#: Databases a command opened; main() closes their connections when the command ends, so a
#: PostgreSQL server sees them closed, not dropped (and an in-process caller leaks none).
OPENED: list[Database] = []


def opened(db: Database) -> Database:
    OPENED.append(db)
    return db


def open_workflow(database_url: str | None, home: str | None) -> WorkflowStore:
    """The workflow store of an existing database (nothing is created), with the key ring."""
    from statekeep.keys import open_key_ring
    from statekeep.workflow import SQLWorkflowStore

    settings = load_settings(database_url, home)
    db = opened(open_sql(settings, "workflow"))
    return SQLWorkflowStore(db, keys=open_key_ring(settings, db))


def memory_store_for(
    database_url: str | None,
    home: str | None,
    memory_url: str | None,
    *,
    read_only: bool = False,
    embedder: str | None = None,
) -> MemoryStore:
    settings = load_settings(database_url, home, memory_url)
    chosen = None if embedder is None else load_embedder(embedder)
    if read_only:  # a LanceDB folder is read beside a worker that writes it; nothing is created
        return open_memory(settings, chosen, read_only=True)
    from statekeep.memory import open_memory_store

    settings.check()
    return open_memory_store(settings.memory_url, chosen)


def load_object(path: str, option: str) -> Any:
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


def runtime_factory(path: str, option: str) -> Callable[[Settings], Runtime]:
    target = load_object(path, option)
    if not callable(target):
        raise InvalidInputError(f"{path!r} is not callable", field=option)
    return target  # type: ignore[no-any-return]


def load_embedder(path: str) -> Embedder:
    from statekeep.memory.embedders import is_embedder

    target = load_object(path, "--embedder")
    if isinstance(target, type) or (not is_embedder(target) and callable(target)):
        target = target()
    if not is_embedder(target):
        raise InvalidInputError(f"{path!r} is not an Embedder (name, dimension, embed)", field="--embedder")
    return target  # type: ignore[no-any-return]


def load_agent(path: str) -> Agent:
    from statekeep.runtime import Agent

    target = load_object(path, "--agent")
    if not isinstance(target, Agent) and callable(target) and not isinstance(target, type):
        target = target()
    if not isinstance(target, Agent):
        raise InvalidInputError(f"{path!r} is not an Agent", field="--agent")
    return target


# --- helpers ---------------------------------------------------------------------------------


def parse_status(value: str, kind: Any) -> Any:
    try:
        return kind(value)
    except ValueError:
        raise InvalidInputError(
            f"unknown status {value!r}; one of {[s.value for s in kind]}", field="--status"
        ) from None


def keep_whole(table: Table, column: int, values: list[str]) -> None:
    """Never cut or wrap the ids of ``column``: they are what the other commands need."""
    col = table.columns[column]
    col.no_wrap, col.overflow = True, "fold"
    col.min_width = max([len(visible(v)) for v in values] + [len(str(col.header))])


def show_table(table: Table) -> None:
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


def print_json_text(text: str) -> None:
    """JSON text as it is (highlighted on a terminal), with JSON's own escapes for control characters.

    Not ``print_json``, which decodes and re-encodes: that would bring back what
    :func:`visible` escaped.
    """
    console.print(JSONHighlighter()(Text(visible(text, json_text=True))), soft_wrap=True)
