"""Commands that serve: a worker that runs agents, and the console with its approval webhook."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from statekeep.errors import InvalidInputError, StatekeepError

if TYPE_CHECKING:
    pass
from statekeep.cli._common import (
    DatabaseURL,
    EmbedderOption,
    Home,
    MemoryURL,
    app,
    checked_settings,
    console,
    load_embedder,
    load_settings,
    runtime_factory,
)

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

    factory = runtime_factory(app_path, "--app")
    settings = checked_settings(database_url, home, memory_url)
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
    from statekeep._check import parse
    from statekeep.web import Stores, check_config, create_app

    _configure_logs(log_level, log_format)
    try:
        tokens = parse(tokens_file.read_bytes(), str(tokens_file))
    except InvalidInputError as exc:
        raise InvalidInputError(str(exc), field="--tokens-file") from None
    if not isinstance(tokens, dict):
        raise InvalidInputError(f"{tokens_file} must hold a JSON object", field="--tokens-file")
    check_config(tokens, max_body)  # before any store is opened
    settings = load_settings(database_url, home, memory_url)
    stores = Stores.open(settings, embedder=None if embedder is None else load_embedder(embedder))
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
