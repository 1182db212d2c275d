"""Finding runs: the filters and pages of :meth:`WorkflowStore.search_runs`, and whose run a run is.

Pure functions over :class:`~statekeep.workflow.Run` records, shared by the
contract's default search and by the backends that search with queries.
"""

from __future__ import annotations

import json
from collections.abc import Iterable

from statekeep._check import check_id, check_int, check_text
from statekeep.errors import InvalidInputError
from statekeep.workflow._types import Run, RunPage, RunStatus

#: The largest page :meth:`WorkflowStore.search_runs` returns.
MAX_PAGE = 1000


def statuses(status: RunStatus | str | Iterable[RunStatus | str]) -> list[RunStatus]:
    """One status, its name, or several, as statuses.

    Raises:
        InvalidInputError: a value that names no status.
    """
    given = [status] if isinstance(status, str) else status
    try:
        return [RunStatus(s) for s in given]
    except (TypeError, ValueError):
        names = ", ".join(s.value for s in RunStatus)
        raise InvalidInputError(f"must be one or more of {names}", field="status") from None


def run_owner(run: Run) -> str | None:
    """Whose run it is: the owner a :class:`~statekeep.runtime.Runtime` agent run was started for.

    An agent run is the workflow ``agent.<name>`` with the input ``(owner,
    session_id, task)``; other workflows' runs have no owner (None).
    """
    stored = getattr(run, "owner", None)  # a store that records owners in a column of their own
    if isinstance(stored, str):
        return stored
    args = run.input.get("args") if isinstance(run.input, dict) else None
    if run.workflow.startswith("agent.") and isinstance(args, list) and args and isinstance(args[0], str):
        return args[0]
    return None


def check_run_filters(
    owner: str | Iterable[str] | None,
    text: str | None,
    run_ids: Iterable[str] | None,
    limit: int,
    offset: int,
) -> tuple[list[str] | None, str | None, list[str] | None]:
    """The filters of :meth:`WorkflowStore.search_runs`, checked: (owners, text, run ids)."""
    check_int(limit, "limit", minimum=1, maximum=MAX_PAGE)
    check_int(offset, "offset")
    owners = None
    if owner is not None:
        owners = (
            [check_id(owner, "owner")] if isinstance(owner, str) else [check_id(o, "owner") for o in owner]
        )
    if text is not None:
        if not isinstance(text, str):
            raise InvalidInputError("must be a string or None", field="text")
        text = check_text(text, "text", limit=1000) if text.strip() else None
    ids = None if run_ids is None else [check_id(r, "run_ids") for r in run_ids]
    return owners, text, ids


def run_matches(run: Run, needle: str) -> bool:
    """Whether the run's id, workflow, input or error contains ``needle`` (any case), as a person reads it."""
    shown = json.dumps(run.input, ensure_ascii=False)
    blob = " ".join([run.run_id, run.workflow, run.error or "", json.dumps(run.input), shown])
    return needle.casefold() in blob.casefold()


def page_of(
    matched: Iterable[Run],
    status: RunStatus | str | Iterable[RunStatus | str] | None,
    limit: int,
    offset: int,
) -> RunPage:
    """A :class:`RunPage` of the runs that matched the other filters: counted per status, newest first."""
    wanted = None if status is None else set(statuses(status))
    counts: dict[str, int] = {}
    shown = []
    for run in matched:
        counts[run.status.value] = counts.get(run.status.value, 0) + 1
        if wanted is None or run.status in wanted:
            shown.append(run)
    shown.sort(key=lambda r: (r.created_at, r.run_id), reverse=True)
    return RunPage(shown[offset : offset + limit], len(shown), offset, limit, counts)


__all__ = ["MAX_PAGE", "check_run_filters", "page_of", "run_matches", "run_owner", "statuses"]
