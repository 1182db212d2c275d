"""What every workflow-store backend decides the same way, whatever holds its rows.

Checks of the arguments that arrive from people (a decision, an event, a
retention policy) and the pure choices a backend makes over its rows (whether a
stored run is the one being opened again, which finished runs retention
deletes, how a fork renames idempotency keys, which checkpoint a fork starts
from), written once for the SQL and in-memory backends.
"""

from __future__ import annotations

from collections.abc import Iterable
from datetime import datetime, timedelta
from typing import Any

from statekeep._check import check_duration, check_id, check_int, check_storable
from statekeep.errors import InvalidInputError, RunConflictError
from statekeep.workflow import codec
from statekeep.workflow._types import APPROVAL_STATUSES, Run
from statekeep.workflow.run_write import now


def same_run(stored: Run, run: dict[str, Any]) -> Run:
    """``stored``, when it is the run that ``run`` (the fields of :meth:`WorkflowStore.open_run`) opens.

    Raises:
        RunConflictError: ``stored`` belongs to another workflow or was started with another input.
    """
    if stored.workflow != run["workflow"]:
        raise RunConflictError(
            stored.run_id, f"belongs to workflow {stored.workflow!r}, not {run['workflow']!r}"
        )
    if codec.digest(stored.input) != run["input_hash"]:
        raise RunConflictError(stored.run_id, "was started with another input")
    return stored


def check_decision(approval_id: str, approve: bool, by: str, comment: str | None, result: Any) -> str:
    """Validate a decision (:meth:`WorkflowStore.decide`) before anything is read; return the encoded result.

    Raises:
        InvalidInputError: a bad id, ``by`` empty, ``approve`` not a bool, ``comment``
            not storable text, or ``result`` not JSON.
    """
    check_id(approval_id, "approval_id")
    if not isinstance(by, str) or not by.strip():
        raise InvalidInputError("must name who decides", field="by")
    check_id(by, "by")
    if not isinstance(approve, bool):
        raise InvalidInputError("must be True or False", field="approve")
    if comment is not None:
        if not isinstance(comment, str):
            raise InvalidInputError("must be a string or None", field="comment")
        check_storable(comment, "comment")
    return encode(result, "result")


def check_approval_filters(
    status: str | None, run_id: str | None, kind: str | None, action: str | None
) -> dict[str, str]:
    """The filters of :meth:`WorkflowStore.approvals` that were given, checked: field name to value.

    Raises:
        InvalidInputError: an unknown status or kind, or a filter that is not an id.
    """
    if status is not None and status not in APPROVAL_STATUSES:
        raise InvalidInputError(f"must be one of {APPROVAL_STATUSES} or None", field="status")
    if kind is not None and kind not in ("gate", "ambiguous"):
        raise InvalidInputError("must be 'gate', 'ambiguous' or None", field="kind")
    given = {"status": status, "run_id": run_id, "kind": kind, "action": action}
    return {field: check_id(value, field) for field, value in given.items() if value is not None}


#: The most approvals one page of :meth:`WorkflowStore.approvals` may ask for (``limit``).
MAX_APPROVALS_PAGE = 10_000


def check_approvals_page(limit: int | None, after: str | None) -> tuple[int | None, str | None]:
    """The page of :meth:`WorkflowStore.approvals` asked for (``limit``, ``after``), checked.

    Raises:
        InvalidInputError: ``limit`` not from 1 to :data:`MAX_APPROVALS_PAGE`, or ``after`` not an id.
    """
    if limit is not None:
        limit = check_int(limit, "limit", minimum=1, maximum=MAX_APPROVALS_PAGE)
    return limit, None if after is None else check_id(after, "after")


def check_event(name: str, payload: Any) -> str:
    """Validate an event (:meth:`WorkflowStore.send_event`); return its encoded payload.

    Raises:
        InvalidInputError: an empty or overlong name, or a payload that is not JSON.
    """
    check_id(name, "name")
    return encode(payload, "payload")


def encode(value: Any, field: str) -> str:
    """``value`` as JSON text.

    Raises:
        InvalidInputError: naming ``field``, when the value is not JSON.
    """
    try:
        return codec.to_json(value)
    except codec.NotJSONError as exc:
        raise InvalidInputError(str(exc), field=field) from exc


def check_run_ids(run_ids: list[str]) -> list[str]:
    """The run ids of :meth:`WorkflowStore.delete_runs`, checked.

    Raises:
        InvalidInputError: not a list (or tuple) of run ids.
    """
    if not isinstance(run_ids, list | tuple):
        raise InvalidInputError("must be a list of run ids", field="run_ids")
    return [check_id(run_id, "run_id") for run_id in run_ids]


def check_fork_point(run_id: str, last_seq: int, at_seq: int) -> None:
    """Refuse a fork past the source run's last completed step.

    Raises:
        InvalidInputError: ``at_seq`` is past ``last_seq``.
    """
    if at_seq > last_seq:
        raise InvalidInputError(
            f"run {run_id!r} has {last_seq} completed steps: cannot fork at step {at_seq}", field="at_seq"
        )


def check_retention(older_than: timedelta | None, keep_last: int | None, workflow: str | None) -> None:
    """Validate a retention policy (:meth:`WorkflowStore.purgeable`).

    Raises:
        InvalidInputError: neither ``older_than`` nor ``keep_last``, a negative one, a bad workflow name.
    """
    if older_than is None and keep_last is None:
        raise InvalidInputError("give older_than, keep_last, or both", field="older_than")
    if older_than is not None:
        check_duration(older_than, "older_than", positive=False)
    if keep_last is not None:
        check_int(keep_last, "keep_last")
    if workflow is not None:
        check_id(workflow, "workflow")


def purge_selection(
    finished: Iterable[tuple[str, str, datetime]], older_than: timedelta | None, keep_last: int | None
) -> list[str]:
    """The finished runs a retention policy deletes, sorted by id.

    ``finished`` holds (run id, workflow, finished at) of finished runs. A run goes
    when it finished before ``older_than`` ago, or when ``keep_last`` newer runs of
    its workflow finished after it.
    """
    rows = sorted(finished, key=lambda r: r[0])
    rows.sort(key=lambda r: r[2], reverse=True)  # newest first; ties by id (the sort is stable)
    doomed: set[str] = set()
    if older_than is not None:
        cutoff = now() - older_than
        doomed |= {run_id for run_id, _, finished_at in rows if finished_at < cutoff}
    if keep_last is not None:
        seen: dict[str, int] = {}
        for run_id, workflow, _ in rows:
            seen[workflow] = seen.get(workflow, 0) + 1
            if seen[workflow] > keep_last:
                doomed.add(run_id)
    return sorted(doomed)


def forked_key(key: str, source_id: str, new_id: str) -> str:
    """The idempotency key a completed call of ``source_id`` takes in its fork ``new_id``."""
    return new_id + key[len(source_id) :] if key.startswith(f"{source_id}/") else f"{new_id}/{key}"


def last_set(values: Iterable[int | None]) -> int | None:
    """The last value that is not None (the checkpoint a fork starts from), or None."""
    found = None
    for value in values:
        if value is not None:
            found = value
    return found


__all__ = [
    "check_approval_filters",
    "check_decision",
    "check_event",
    "check_fork_point",
    "check_retention",
    "check_run_ids",
    "encode",
    "forked_key",
    "last_set",
    "purge_selection",
    "same_run",
]
