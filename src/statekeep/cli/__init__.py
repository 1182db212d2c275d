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

import os

import typer

from statekeep._literal import pretty, visible
from statekeep.cli import data, runs, serve, upkeep  # noqa: F401 - each registers its commands
from statekeep.cli._common import OPENED, app, err_console, literal
from statekeep.errors import StatekeepError


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
        while OPENED:
            OPENED.pop().dispose()


__all__ = ["app", "literal", "main", "pretty", "visible"]
