"""The demo that ``make demo`` runs: working state that outlives its process.

One process saves a lead-research plan as version 1; a second, separate
process loads it, carries on, and saves version 2; the first process then
tries to save from its stale copy and is refused. Everything lives in a SQLite
file under the configured home (``.statekeep/`` by default).
"""

from __future__ import annotations

import subprocess
import sys
from typing import ClassVar

from rich.console import Console
from rich.table import Table

from statekeep.config import Settings
from statekeep.errors import VersionConflictError
from statekeep.working import SQLWorkingStateStore, WorkingState


class LeadPlan(WorkingState):
    """The working state of the demo's lead-research run."""

    state_schema: ClassVar[str] = "demo.lead_plan"
    state_version: ClassVar[int] = 1
    lead: str
    done: list[str] = []
    todo: list[str] = []


def _store(settings: Settings) -> SQLWorkingStateStore:
    settings.check()
    return SQLWorkingStateStore(settings.url_for("working"))


def child(run_id: str, database_url: str) -> None:
    """The second process: load the plan, do one step, save the next version."""
    store = SQLWorkingStateStore(database_url)
    current = store.get(run_id).version
    plan = store.load(run_id, LeadPlan)
    step = plan.todo[0]
    plan = plan.model_copy(update={"done": [*plan.done, step], "todo": plan.todo[1:]})
    saved = store.save(run_id, plan, expected_version=current)
    print(f"  [second process] loaded v{current}, did {step!r}, saved v{saved.version}")


def run(settings: Settings | None = None, console: Console | None = None) -> None:
    """Narrate the demo on the embedded default (or the configured database)."""
    console = console or Console()
    settings = settings or Settings.load()
    store = _store(settings)
    run_id = f"lead-research-{store.latest_version('demo-counter') + 1}"
    store.save("demo-counter", LeadPlan(lead="-"))
    url = settings.url_for("working")
    console.rule("[bold]statekeep demo: working state that outlives its process")
    console.print(f"Database: [cyan]{store.db!r}[/]")
    plan = LeadPlan(lead="Ada Lovelace, Analytical Engines Ltd", todo=["research", "draft CRM update"])
    first = store.save(run_id, plan, expected_version=0)
    console.print(f"1. This process saved run [bold]{run_id}[/] working state v{first.version}.")
    console.print("2. A separate process loads it and carries on:")
    subprocess.run([sys.executable, "-m", "statekeep.demo", run_id, url], check=True)
    console.print("3. This process still holds v1 and tries to save over it:")
    try:
        store.save(run_id, plan.model_copy(update={"todo": ["stale"]}), expected_version=first.version)
    except VersionConflictError as exc:
        console.print(f"   refused, nothing written: [yellow]{exc}[/]")
    table = Table("version", "schema", "done", "todo", "bytes", title=f"versions of {run_id}")
    for record in store.versions(run_id):
        state = store.load(run_id, LeadPlan, version=record.version)
        table.add_row(
            str(record.version),
            f"{record.schema_name} v{record.schema_version}",
            ", ".join(state.done),
            ", ".join(state.todo),
            str(record.size),
        )
    console.print(table)
    console.print("Every version is immutable JSON, validated by pydantic on the way in and out.")
    store.db.dispose()


if __name__ == "__main__":
    child(sys.argv[1], sys.argv[2])
