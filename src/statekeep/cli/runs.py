"""Commands for workflow runs and the approvals people decide."""

from __future__ import annotations

import json
from dataclasses import asdict
from typing import TYPE_CHECKING, Annotated, Any

import typer
from rich.table import Table

if TYPE_CHECKING:
    from statekeep.audit import Action
    from statekeep.workflow import Approval, Run
from statekeep.cli._common import (
    DatabaseURL,
    Home,
    JSONOut,
    RunID,
    approvals_app,
    console,
    keep_whole,
    literal,
    open_workflow,
    parse_status,
    print_json_text,
    record_audit,
    runs_app,
    show_table,
)
from statekeep.errors import InvalidInputError

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
    from statekeep.workflow.search import run_owner

    wanted = None if status is None else parse_status(status, RunStatus)
    page = open_workflow(database_url, home).search_runs(
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
        print_json_text(json.dumps(doc, ensure_ascii=False, indent=2, default=str))
        return
    table = Table(
        "run id", "workflow", "owner", "status", "steps", "created", "updated", caption_justify="left"
    )
    keep_whole(table, 0, [r.run_id for r in page.runs])
    keep_whole(table, 3, [str(r.status) for r in page.runs])
    for column in table.columns[1:3]:
        column.overflow = "fold"  # long names wrap onto the next line, never cut
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
    show_table(table)


@runs_app.command("show")
def runs_show(
    run_id: RunID, json_out: JSONOut = False, database_url: DatabaseURL = None, home: Home = None
) -> None:
    """Show one run: status, owner, input, output, error, checkpoint, what it waits for, and the
    tokens its model calls used."""
    from statekeep.runtime.usage import run_usage

    store = open_workflow(database_url, home)
    run = store.get(run_id)
    usage = run_usage(store.steps(run_id))
    record_audit(database_url, home, "read_run", run.run_id)
    doc = _run_json(run)
    doc["usage"] = {**asdict(usage), "total": usage.total} if json_out else str(usage)
    if json_out:
        print_json_text(json.dumps(doc, ensure_ascii=False, indent=2, default=str))
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

    store = open_workflow(database_url, home)
    entries = timeline(store, store.get(run_id))
    record_audit(database_url, home, "read_run", run_id, {"timeline": len(entries)})
    if json_out:
        rows = [{"at": e.at, "kind": e.kind, "seq": e.seq, "name": e.name, "detail": e.detail,
                 "status": e.status, **e.data} for e in entries]  # fmt: skip
        print_json_text(json.dumps(rows, ensure_ascii=False, indent=2, default=str))
        return
    table = Table("time", "seq", "event", "name", "status", "detail", title=literal(f"run {run_id}"))
    for column in table.columns:
        column.overflow = "fold"  # ids and keys in names and details wrap, never cut
    for e in entries:
        at = f"{e.at:%H:%M:%S.%f}"[:-3]
        seq = "-" if e.seq is None else str(e.seq)
        table.add_row(at, seq, literal(e.kind), literal(e.name), literal(e.status), literal(e.detail))
    console.print(table)


@runs_app.command("cancel")
def runs_cancel(run_id: RunID, database_url: DatabaseURL = None, home: Home = None) -> None:
    """Cancel a live run; no worker will advance it again."""
    store = open_workflow(database_url, home)
    _not_a_thread(store.get(run_id), "cancel")
    run = store.cancel(run_id)
    record_audit(database_url, home, "cancel", run.run_id)
    console.print(literal(f"run {run.run_id}: {run.status}"))


@runs_app.command("retry")
def runs_retry(run_id: RunID, database_url: DatabaseURL = None, home: Home = None) -> None:
    """Make a failed run runnable again: a worker continues it after its last completed step."""
    store = open_workflow(database_url, home)
    _not_a_thread(store.get(run_id), "retry")
    run = store.retry(run_id)
    console.print(
        literal(f"run {run.run_id}: {run.status}; a worker continues it after step #{run.last_seq}")
    )


def _run_json(run: Run) -> dict[str, Any]:
    from statekeep.workflow.search import run_owner

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
    limit: Annotated[
        int | None, typer.Option(help="At most this many (the store says its bound); every one if left out.")
    ] = None,
    after: Annotated[
        str | None, typer.Option(help="Start after this approval id: the last of the page before.")
    ] = None,
    json_out: JSONOut = False,
    database_url: DatabaseURL = None,
    home: Home = None,
) -> None:
    """List approvals waiting for a decision, oldest first (``--all`` for every one), ids in full;
    ``--limit`` and ``--after`` read them a page at a time."""
    store = open_workflow(database_url, home)
    if run is not None:
        store.get(run)  # an unknown run is an error, not an empty list
    found = store.approvals(status=None if all_ else "pending", run_id=run, limit=limit, after=after)
    if json_out:
        shown = [_approval_json(a) for a in found]
        print_json_text(json.dumps(shown, ensure_ascii=False, indent=2, default=str))
        return
    table = Table("approval id", "run", "kind", "action", "arguments", "reason", "status", "expires")
    keep_whole(table, 0, [a.approval_id for a in found])
    keep_whole(table, 1, [a.run_id for a in found])
    for a in found:
        expires = "-" if a.expires_at is None else f"{a.expires_at:%Y-%m-%d %H:%M}"
        table.add_row(
            *map(literal, (a.approval_id, a.run_id, a.kind, a.action)),
            literal(json.dumps(a.args)),  # ASCII JSON: what the call will receive; homoglyphs show as \u
            *map(literal, (a.reason, a.status, expires)),
        )
    table.caption = f"{len(found)} {'approvals' if all_ else 'pending'}"
    if limit is not None and len(found) == limit:
        table.caption += f"; next page: --after {found[-1].approval_id}"
    show_table(table)


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
Result = Annotated[
    str | None,
    typer.Option(
        help="JSON the run receives with the decision: for an ambiguous call rejected (it happened), "
        "the call's output."
    ),
]


@approvals_app.command("approve")
def approvals_approve(
    approval_id: ApprovalID,
    by: By,
    comment: Comment = None,
    result: Result = None,
    database_url: DatabaseURL = None,
    home: Home = None,
) -> None:
    """Approve: the gated action may run, with exactly the arguments shown (for an ambiguous call:
    it did not happen, run it again)."""
    a = _decide(approval_id, True, by, comment, result, database_url, home)
    console.print(
        literal(f"approval {a.approval_id}: {a.status} by {a.decided_by}; run {a.run_id} can resume")
    )


@approvals_app.command("reject")
def approvals_reject(
    approval_id: ApprovalID,
    by: By,
    comment: Comment = None,
    result: Result = None,
    database_url: DatabaseURL = None,
    home: Home = None,
) -> None:
    """Reject: the gated action will not run (for an ambiguous call: it did happen; --result is its
    output)."""
    a = _decide(approval_id, False, by, comment, result, database_url, home)
    console.print(literal(f"approval {a.approval_id}: {a.status} by {a.decided_by}"))


def _decide(
    approval_id: str,
    approve: bool,
    by: str,
    comment: str | None,
    result: str | None,
    database_url: str | None,
    home: str | None,
) -> Approval:
    """Record a decision, trace it, and put it in the audit log."""
    from statekeep.workflow import spans

    value = None
    if result is not None:
        try:
            value = json.loads(result)
        except ValueError as exc:
            raise InvalidInputError(f"must be JSON: {exc}", field="--result") from exc
    store = open_workflow(database_url, home)
    decided = store.decide(approval_id, approve=approve, by=by, comment=comment, result=value)
    spans.approval_decided(decided, store.find(decided.run_id), via="cli")
    action: Action = "approve" if approve else "reject"
    record_audit(database_url, home, action, decided.approval_id, {"run": decided.run_id, "by": by})
    return decided


#: The workflow of LangGraph threads' runs (``statekeep.integrations.langgraph._runs.WORKFLOW``;
#: not imported: the CLI works without LangGraph installed).
LANGGRAPH = "langgraph"


def _not_a_thread(run: Run, what: str) -> None:
    """Refuse to cancel or retry a LangGraph thread's run: the graph, not a statekeep worker, drives it."""
    if run.workflow == LANGGRAPH:
        raise InvalidInputError(
            f"run {run.run_id!r} mirrors a LangGraph thread, which the graph drives, not a statekeep "
            f"worker: {what} it in your application (to erase it: StatekeepSaver.delete_thread)",
            field="run_id",
        )
