"""Erasing an owner from every store at once, with one receipt (GDPR Art. 17, CCPA deletion).

:func:`erase_owner` removes everything statekeep holds of one owner: context
sessions with their events and summaries (and the Agents SDK items of those
sessions, ``statekeep_agents.items``), the working-state versions and the
runs of the owner's runs (journal, tool ledger, approvals, events sent to
them), the owner's memories, the owner's LangGraph threads and store registration
(:mod:`statekeep.integrations.langgraph.erasure`), and last the owner's data keys, so that whatever
bytes of the owner's sealed payloads remain anywhere (a PostgreSQL dead tuple,
a backup) can no longer be decrypted. SQLite files are left without the
deleted bytes (``secure_delete``, then the WAL is checkpointed and truncated).
:class:`~statekeep.runtime.Runtime` and ``statekeep erase OWNER`` call it.

The stores come from the one list of :mod:`statekeep.stores`: each declares how
one owner is erased from it, and erasure runs those hooks in the list's order.

It is safe to call again: a failure half way leaves the rest to find, and a
second call finishes the job (the data keys are shredded last for that reason).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, fields
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

from statekeep._check import check_id
from statekeep.db.catalog import Erased, Erasing, StoreSpec
from statekeep.errors import LiveRunsError, RunFinishedError

if TYPE_CHECKING:
    from statekeep.context import ContextStore
    from statekeep.db import Database
    from statekeep.keys import KeyRing
    from statekeep.memory import MemoryStore
    from statekeep.workflow import WorkflowStore
    from statekeep.working import WorkingStateStore

#: What erasure cannot reach by itself, on every backend.
NOT_REACHED = (
    "backups, snapshots and dumps taken before the erasure: restore them only to erase again "
    "(their sealed payloads open only while a copy of the owner's data key exists)",
    "copies made outside statekeep: model providers' logs, application logs, exports already handed out",
    "other owners' sessions, runs and memories that quote this owner (erasure goes by owner)",
    "the audit log's records of this owner (ids and counts, never content), kept as proof",
    "LangGraph threads written without an owner (StatekeepSaver's owner_key), and a saver or a "
    "StatekeepStore on another database or memory store: erase them there (integrations.langgraph.erasure)",
    "processes that cached this owner's data key or decoded context keep them in memory until "
    "they restart (data keys for at most a minute as the current key)",
)


@dataclass(frozen=True, kw_only=True)
class ErasureReceipt:
    """What :func:`erase_owner` removed from each store, what it rewrote, and what it cannot reach.

    A section per declared store with an erase hook (:mod:`statekeep.stores`), named as the store.

    Attributes:
        owner: The owner erased.
        cancelled: Live runs of the owner that were cancelled first.
        context: ``sessions``, ``events`` (summaries included) and ``summaries`` removed.
        agents: ``items``: the Agents SDK items the owner's sessions stored
            (:class:`~statekeep.integrations.agents.StatekeepSession`) removed.
        working: ``versions`` of working state removed.
        workflow: ``runs``, ``steps`` (journal), ``tool_calls`` (ledger), ``approvals``, ``events``.
        memory: The memory store's own receipt, as a dict (None without a memory store).
        langgraph: ``threads``, ``checkpoints``, ``writes``, ``blobs`` and ``runs`` of the owner's
            LangGraph threads (None without the langgraph extra).
        langgraph_store: ``registrations``: the owner's entries in a LangGraph store's owner
            registry (None without the langgraph extra or a memory store).
        keys: ``data_keys`` shredded (None without a key ring: nothing was sealed).
        locations: Where bytes were rewritten or scrubbed so that nothing deleted stays readable.
        not_reached: What erasure cannot touch by itself, said plainly.
        started_at: When the erasure began.
        finished_at: When it ended.
    """

    owner: str
    cancelled: tuple[str, ...]
    context: dict[str, int]
    agents: dict[str, int]
    working: dict[str, int]
    workflow: dict[str, int]
    langgraph: dict[str, int] | None = None
    memory: dict[str, Any] | None
    langgraph_store: dict[str, int] | None = None
    keys: dict[str, int] | None
    locations: tuple[str, ...]
    not_reached: tuple[str, ...]
    started_at: datetime
    finished_at: datetime = field(default_factory=lambda: datetime.now(UTC))

    def counts(self) -> dict[str, int]:
        """Every count in one flat dict (``context.events``, ``memory.removed``...), as the audit keeps it."""
        flat = {"cancelled": len(self.cancelled)}
        for section in fields(self):
            value = getattr(self, section.name)
            if isinstance(value, dict) and section.name != "memory":  # a store's section
                flat.update((f"{section.name}.{name}", count) for name, count in value.items())
        if self.memory is not None:
            flat["memory.removed"] = int(self.memory["removed"])
        return flat

    def as_dict(self) -> dict[str, Any]:
        """The receipt as a JSON-ready dict."""
        return {f.name: _plain(getattr(self, f.name)) for f in fields(self)}


def _plain(value: object) -> object:
    """A receipt's value as JSON has it: tuples as lists, times in ISO 8601."""
    if isinstance(value, tuple):
        return list(value)
    return value.isoformat() if isinstance(value, datetime) else value


def erase_owner(
    owner: str,
    *,
    context: ContextStore,
    working: WorkingStateStore | None,
    workflow: WorkflowStore,
    memory: MemoryStore | None = None,
    keys: KeyRing | None = None,
    cancel_live: bool = False,
) -> ErasureReceipt:
    """Remove everything of ``owner`` from every store; see the module docstring.

    Live runs of the owner are refused, unless ``cancel_live``: then they are
    cancelled first (their leases revoked, so no worker advances them again).

    Every declared store with an erase hook (:mod:`statekeep.stores`) is erased, in
    the list's order: the stores given here through their objects, an integration's
    tables through the database of the store they live in.

    Raises:
        LiveRunsError: the owner has live runs and ``cancel_live`` is False; nothing was erased.
        InvalidInputError: ``owner`` is not an owner id.
        ErasureError: rows were deleted but a file could not be rewritten; erase again.
    """
    from statekeep.stores import declared

    check_id(owner, "owner")
    started = datetime.now(UTC)
    cancelled = _settle_live_runs(workflow, owner, cancel_live)
    given = {"context": context, "working": working, "workflow": workflow, "memory": memory, "keys": keys}
    specs = [spec for spec in declared() if spec.erase is not None]
    handles = {spec.name: _handle(spec, given) for spec in specs}
    # the ids are found before anything is deleted: working state is found by run, items by session
    runs = tuple(r.run_id for r in workflow.runs_of(owner))
    erasing = Erasing(owner, run_ids=runs, session_ids=tuple(context.sessions_of(owner)))
    erased = _erase_in_order(specs, handles, erasing)
    databases = _databases(*(handles[spec.name] for spec in specs if spec.lives_in is not None))
    locations = [f"{db!r}: {db.scrub(owner)}" for db in databases]
    not_reached = list(NOT_REACHED)
    for db in databases:  # what each backend keeps below the rows (its dialect says)
        not_reached.extend(line for line in db.dialect.not_reached if line not in not_reached)
    for result in erased.values():
        if result is not None:
            locations.extend(result.locations)
            not_reached.extend(line for line in result.not_reached if line not in not_reached)
    sections: dict[str, Any] = {name: None if r is None else r.counts for name, r in erased.items()}
    return ErasureReceipt(
        owner=owner,
        cancelled=tuple(cancelled),
        **sections,
        locations=tuple(locations),
        not_reached=tuple(not_reached),
        started_at=started,
    )


def _handle(spec: StoreSpec[Any], given: Mapping[str, object]) -> object:
    """What a store's erase hook works through: the store given, its tables' database, or the store
    object of its whole (a part without tables of its own, the LangGraph store's registry in memory)."""
    if spec.name in given:
        return given[spec.name]
    if spec.lives_in is None:
        return given.get(spec.part_of or "")
    from statekeep.db import Database

    db = getattr(given.get(spec.lives_in or ""), "db", None)
    return db if isinstance(db, Database) else None


def _erase_in_order(
    specs: Sequence[StoreSpec[Any]], handles: Mapping[str, object], erasing: Erasing
) -> dict[str, Erased | None]:
    """Run each erase hook in the list's order; a part (``part_of``) just before its whole and again after.

    Working state before the runs (should the process die in between, the runs are still there
    to find, and erasing again finishes the job); the Agents SDK items before their sessions
    (likewise), and again after them: an item a session stored meanwhile goes too.
    """
    names = {spec.name for spec in specs}

    def run(spec: StoreSpec[Any]) -> Erased | None:
        assert spec.erase is not None
        return spec.erase(handles[spec.name], erasing)

    erased: dict[str, Erased | None] = {}
    for spec in specs:
        if spec.part_of in names:
            continue  # erased around its whole
        around = [part for part in specs if part.part_of == spec.name]
        for part in around:
            erased[part.name] = run(part)
        erased[spec.name] = run(spec)
        for part in around:
            first, again = erased[part.name], run(part)
            erased[part.name] = first + again if first and again else first or again
    return erased


def _settle_live_runs(workflow: WorkflowStore, owner: str, cancel_live: bool) -> list[str]:
    """Refuse (or cancel) the owner's live runs; twice, for a run started meanwhile."""
    cancelled: list[str] = []
    for _ in range(3):
        live = [r.run_id for r in workflow.runs_of(owner) if not r.status.finished]
        if not live:
            return cancelled
        if not cancel_live:
            raise LiveRunsError(owner, live)
        for run_id in live:
            try:
                workflow.cancel(run_id)
                cancelled.append(run_id)
            except RunFinishedError:  # it finished meanwhile: nothing to cancel
                pass
    live = [r.run_id for r in workflow.runs_of(owner) if not r.status.finished]
    if live:  # runs keep being started for this owner: stop them at the source first
        raise LiveRunsError(owner, live)
    return cancelled


def _databases(*stores: object) -> list[Database]:
    """The distinct SQL databases of these stores or databases (a Database each, in order).

    Stores opened one by one on the same URL (a Runtime's, on one SQLite file) are
    one database: scrubbed once, named once in the receipt. An in-memory SQLite
    database is its own, whatever its URL.
    """
    from statekeep.db import Database

    found: dict[object, Database] = {}
    for store in stores:
        db = store if isinstance(store, Database) else getattr(store, "db", None)
        if isinstance(db, Database):
            found.setdefault(id(db) if db.in_memory else db.url.render_as_string(hide_password=False), db)
    return list(found.values())
