"""The ``statekeep`` command line."""

from __future__ import annotations

from typing import Annotated

import typer
from rich.console import Console

from statekeep.config import Settings
from statekeep.errors import StatekeepError

app = typer.Typer(help="Durable state for AI agents.", no_args_is_help=True, pretty_exceptions_enable=False)
db_app = typer.Typer(help="Database schema.", no_args_is_help=True)
app.add_typer(db_app, name="db")
console = Console()
err_console = Console(stderr=True)

DatabaseURL = Annotated[
    str | None,
    typer.Option("--database-url", envvar="STATEKEEP_DATABASE_URL", help="SQL stores' URL."),
]
Home = Annotated[str | None, typer.Option("--home", envvar="STATEKEEP_HOME", help="Embedded data folder.")]


@app.command()
def demo(database_url: DatabaseURL = None, home: Home = None) -> None:
    """Run the narrated demo on the embedded default (or --database-url)."""
    from statekeep import demo as demo_module

    demo_module.run(Settings.load(home=home, database_url=database_url), console)


@db_app.command("upgrade")
def db_upgrade(database_url: DatabaseURL = None, home: Home = None) -> None:
    """Create or upgrade every store's tables (idempotent)."""
    from statekeep.db import Database
    from statekeep.working import sql as working_sql

    settings = Settings.load(home=home, database_url=database_url)
    settings.check()
    db = Database(settings.url_for("working"))
    working_sql.setup(db)
    console.print(f"working state: up to date in {db!r}")


def main() -> None:
    """Entry point: a StatekeepError prints one line and exits 1, without a traceback."""
    try:
        app(standalone_mode=False)
    except StatekeepError as exc:
        err_console.print(f"[red]error:[/] {exc}")
        raise SystemExit(1) from None
    except (typer.Abort, KeyboardInterrupt):
        err_console.print("aborted")
        raise SystemExit(130) from None
    except Exception as exc:  # click usage errors arrive here in non-standalone mode
        import click

        if isinstance(exc, click.ClickException):
            exc.show()
            raise SystemExit(exc.exit_code) from None
        raise
