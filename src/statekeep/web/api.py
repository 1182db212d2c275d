"""What the console's API answers, computed once: the JSON routes and the pages both call :class:`Api`.

Every method takes the caller's :class:`~statekeep.web.access.Grant` and
applies its scope: a run, an approval or an owner outside it is a 403, and
listings leave out what it does not cover.
"""

from __future__ import annotations

import json
from datetime import datetime
from typing import Any, Literal

from fastapi import HTTPException, Request
from pydantic import BaseModel, ConfigDict, Field, StrictBool

from statekeep import _inspect
from statekeep.audit import Action, AuditLog
from statekeep.db import Database
from statekeep.errors import InvalidInputError, NotFoundError
from statekeep.web.access import Access, Grant
from statekeep.web.stores import Stores
from statekeep.workflow import Approval, Run, RunStatus, spans
from statekeep.workflow.search import run_owner

#: What a person decides about a wait-free run, in the order the console lists statuses.
STATUSES = [s.value for s in RunStatus]
#: Approvals read from the store at a time for a scoped grant's page (most may be outside its scope).
SCOPED_BATCH = 1000


class Decision(BaseModel):
    """A person's decision on one approval. Who decides comes from the token, not from here."""

    model_config = ConfigDict(extra="forbid")

    approve: StrictBool
    comment: str | None = Field(default=None, max_length=10_000)
    result: Any = Field(
        default=None,
        description="For a rejected ambiguous call: the output the call had (it did happen).",
    )


class ApprovalOut(BaseModel):
    """An approval as the console shows it (read from a :class:`~statekeep.workflow.Approval`)."""

    model_config = ConfigDict(from_attributes=True)

    approval_id: str
    run_id: str
    kind: str
    action: str
    args: dict[str, Any]
    reason: str
    status: str
    created_at: datetime
    expires_at: datetime | None
    decided_by: str | None
    decided_at: datetime | None
    comment: str | None
    result: Any
    owner: str | None = None
    deciders: list[str] = Field(default_factory=list, description="Who may decide it (their tokens' scope).")


class RunOut(BaseModel):
    """A run's progress: enough to see whether it waits, runs or finished, and why."""

    model_config = ConfigDict(from_attributes=True)

    run_id: str
    workflow: str
    version: int
    status: RunStatus
    error: str | None
    created_at: datetime
    updated_at: datetime
    finished_at: datetime | None
    waiting: dict[str, Any] | None
    owner: str | None = None
    parent_id: str | None = None
    last_seq: int = 0


class RunDetail(RunOut):
    """A run with its input, output, token usage, children and approvals."""

    input: Any = None
    output: Any = None
    lease_owner: str | None = None
    state_version: int | None = None
    usage: dict[str, int] = Field(default_factory=dict)
    children: list[RunOut] = Field(default_factory=list)
    approvals: list[ApprovalOut] = Field(default_factory=list)


class RunsPage(BaseModel):
    """A page of runs, newest first."""

    runs: list[RunOut]
    total: int
    offset: int
    limit: int
    counts: dict[str, int]
    workflows: list[str]


class EntryOut(BaseModel):
    """One line of a run's timeline."""

    at: datetime
    kind: str
    seq: int | None
    name: str
    detail: str
    status: str
    data: dict[str, Any]


class ModelCallOut(BaseModel):
    """One model call: the context it was sent (sections, tokens, messages), its answer, its usage."""

    turn: int
    seq: int
    at: datetime
    attempt: int
    content: str | None
    tool_calls: list[dict[str, Any]]
    usage: dict[str, int]
    context: dict[str, Any] | None
    failed: dict[str, Any] | None


class StateOut(BaseModel):
    """One working-state version of a run."""

    version: int
    schema_name: str
    schema_version: int
    created_at: datetime
    size: int


class MemoryOut(BaseModel):
    """A memory with its provenance (and its score, in a search)."""

    id: str
    content: str
    kind: str
    tags: list[str]
    source: str
    trust: float
    session_id: str | None
    run_id: str | None
    event_id: str | None
    created_at: datetime
    expires_at: datetime | None
    state: str
    score: float | None = None


class MemoriesOut(BaseModel):
    """An owner's memories, or the hits of a search of them."""

    owner: str
    query: str | None
    memories: list[MemoryOut]
    available: bool = True


def _run_out(run: Run, model: type[RunOut] = RunOut, **extra: Any) -> Any:
    return model.model_validate({**_fields(run), "owner": run_owner(run), **extra})


def _fields(run: Run) -> dict[str, Any]:
    return {name: getattr(run, name) for name in run.__dataclass_fields__}


class Api:
    """The console's reads and decisions over ``stores``, within each caller's scope."""

    def __init__(self, stores: Stores, access: Access) -> None:
        self.stores, self.access = stores, access
        self.store = stores.workflow
        self._log: AuditLog | Literal[False] | None = None  # opened on the first record

    # --- scope ------------------------------------------------------------------------------

    def _owner_of(self, run_id: str, cache: dict[str, str | None]) -> str | None:
        """A run's owner, read once per request."""
        if run_id not in cache:
            found = self.store.find(run_id)
            cache[run_id] = None if found is None else run_owner(found)
        return cache[run_id]

    def _approval_allowed(self, grant: Grant, approval: Approval, cache: dict[str, str | None]) -> bool:
        return not grant.scoped or grant.allows(approval.action, self._owner_of(approval.run_id, cache))

    def _visible(self, grant: Grant, run: Run) -> bool:
        if not grant.scoped:
            return True
        if grant.owners is not None and run_owner(run) not in grant.owners:
            return False
        if grant.gates is None:
            return True
        found = self.store.approvals(status=None, run_id=run.run_id)
        return any(a.action in grant.gates for a in found)

    def _run(self, grant: Grant, run_id: str) -> Run:
        run = self.store.get(run_id)
        if not self._visible(grant, run):
            raise HTTPException(403, f"run {run_id!r} is outside this token's scope")
        return run

    def _owner(self, grant: Grant, owner: str) -> None:
        if grant.scoped and (grant.owners is None or owner not in grant.owners):
            raise HTTPException(403, f"the memories of {owner!r} are outside this token's scope")

    # --- runs -------------------------------------------------------------------------------

    def runs(
        self,
        grant: Grant,
        *,
        status: str | None = None,
        workflow: str | None = None,
        owner: str | None = None,
        q: str | None = None,
        limit: int = 25,
        offset: int = 0,
    ) -> RunsPage:
        """Runs newest first within the grant's scope, filtered, a page at a time."""
        owners: list[str] | None = None if owner in (None, "") else [str(owner)]
        if grant.owners is not None:
            owners = sorted(grant.owners) if owners is None else [o for o in owners if o in grant.owners]
        run_ids = None
        if grant.gates is not None:
            run_ids = sorted({a.run_id for a in self.store.approvals(status=None) if a.action in grant.gates})
        if owners == [] or run_ids == []:
            return RunsPage(runs=[], total=0, offset=offset, limit=limit, counts={}, workflows=[])
        page = self.store.search_runs(
            status=status or None,
            workflow=workflow or None,
            owner=owners,
            text=q or None,
            run_ids=run_ids,
            limit=limit,
            offset=offset,
        )
        workflows = (
            self.store.workflow_names() if not grant.scoped else sorted({r.workflow for r in page.runs})
        )
        return RunsPage(
            runs=[_run_out(r) for r in page.runs],
            total=page.total,
            offset=page.offset,
            limit=page.limit,
            counts=page.counts,
            workflows=workflows,
        )

    def run(self, grant: Grant, run_id: str) -> RunDetail:
        """A run, its token usage, its children and its approvals."""
        run = self._run(grant, run_id)
        calls = _inspect.model_calls(self.store, run_id)
        children = [_run_out(c) for c in self.store.list_runs(parent_id=run_id, limit=10_000)]
        cache: dict[str, str | None] = {}
        approvals = [
            self._approval_out(a, cache)
            for a in self.store.approvals(status=None, run_id=run_id)
            if self._approval_allowed(grant, a, cache)
        ]
        detail: RunDetail = _run_out(
            run,
            RunDetail,
            usage=_inspect.token_usage(calls),
            children=children,
            approvals=approvals,
        )
        self._audit(grant, "read_run", run_id, None)  # its input, output and error
        return detail

    def timeline(self, grant: Grant, run_id: str) -> list[EntryOut]:
        """What the run did, in order."""
        run = self._run(grant, run_id)
        entries = [EntryOut.model_validate(e.__dict__) for e in _inspect.timeline(self.store, run)]
        self._audit(grant, "read_run", run_id, {"timeline": len(entries)})  # tool calls and their results
        return entries

    def model_calls(self, grant: Grant, run_id: str) -> list[ModelCallOut]:
        """Each model call with the exact context it was sent."""
        self._run(grant, run_id)
        calls = [ModelCallOut.model_validate(c.__dict__) for c in _inspect.model_calls(self.store, run_id)]
        self._audit(grant, "read_context", run_id, {"model_calls": len(calls)})
        return calls

    def states(self, grant: Grant, run_id: str) -> list[StateOut]:
        """The run's working-state versions, oldest first (empty without a working-state store)."""
        self._run(grant, run_id)
        if self.stores.working is None:
            return []
        return [
            StateOut(
                version=v.version,
                schema_name=v.schema_name,
                schema_version=v.schema_version,
                created_at=v.created_at,
                size=v.size,
            )
            for v in self.stores.working.versions(run_id)
        ]

    def state(self, grant: Grant, run_id: str, version: int) -> Any:
        """One working-state version, as its JSON."""
        self._run(grant, run_id)
        if self.stores.working is None:
            raise NotFoundError("this console has no working-state store")
        state = json.loads(self.stores.working.get(run_id, version=version).state)
        self._audit(grant, "read_state", run_id, {"version": version})
        return state

    def state_diff(self, grant: Grant, run_id: str, a: int, b: int) -> list[str]:
        """A unified diff between two versions of the run's working state."""
        self._run(grant, run_id)
        if self.stores.working is None:
            raise NotFoundError("this console has no working-state store")
        diff = _inspect.state_diff(self.stores.working, run_id, a, b)
        self._audit(grant, "read_state", run_id, {"version": b, "against": a})
        return diff

    # --- approvals ----------------------------------------------------------------------------

    def _approval_out(self, approval: Approval, cache: dict[str, str | None]) -> ApprovalOut:
        owner = self._owner_of(approval.run_id, cache)
        out = ApprovalOut.model_validate(approval)
        return out.model_copy(update={"owner": owner, "deciders": self.access.deciders(approval, owner)})

    def approvals(
        self,
        grant: Grant,
        *,
        status: str = "pending",
        run_id: str | None = None,
        kind: str | None = None,
        action: str | None = None,
        limit: int | None = None,
        after: str | None = None,
    ) -> list[ApprovalOut]:
        """Approvals within the grant's scope, oldest first (``status="all"`` for every one).

        ``limit``: at most this many within the scope (for a scoped grant the store is
        read :data:`SCOPED_BATCH` at a time, or ``limit`` if more, until they are found);
        ``after``: an approval id, the last of the page before (:meth:`WorkflowStore.approvals`).
        """
        cache: dict[str, str | None] = {}
        out: list[ApprovalOut] = []
        batch = limit if limit is None or not grant.scoped else max(limit, SCOPED_BATCH)
        while True:
            found = self.store.approvals(
                status=None if status == "all" else status,
                run_id=run_id,
                kind=kind,
                action=action,
                limit=batch,
                after=after,
            )
            for a in found:
                if self._approval_allowed(grant, a, cache):
                    out.append(self._approval_out(a, cache))
                    if len(out) == limit:
                        return out  # the next page starts after the last one returned
            if batch is None or len(found) < batch:
                return out
            after = found[-1].approval_id  # a scoped token saw fewer than a page: read on

    def approval(self, grant: Grant, approval_id: str) -> ApprovalOut:
        """One approval (403 outside the grant's scope)."""
        approval = self.store.approval(approval_id)
        cache: dict[str, str | None] = {}
        if not self._approval_allowed(grant, approval, cache):
            raise HTTPException(
                403, f"approval {approval.approval_id!r} ({approval.action!r}) is outside this token's scope"
            )
        return self._approval_out(approval, cache)

    def _audit(
        self, grant: Grant, action: Action, target: str, detail: dict[str, int | str | bool | None] | None
    ) -> None:
        """Record who did what through the webhook or the console (never the content)."""
        if self._log is None:
            self._log = _audit_log(self.store) or False
        if self._log:
            self._log.record(grant.identity, action, target, via="webhook", detail=detail)

    def decide(self, grant: Grant, approval_id: str, decision: Decision, *, via: str) -> ApprovalOut:
        """Record the grant's person's decision, once (403 out of scope, 409 decided, 410 expired)."""
        self.approval(grant, approval_id)
        decided = self.store.decide(
            approval_id,
            approve=decision.approve,
            by=grant.identity,
            comment=decision.comment,
            result=decision.result,
        )
        spans.approval_decided(decided, self.store.find(decided.run_id), via=via)
        self._audit(grant, "approve" if decision.approve else "reject", approval_id, {"run": decided.run_id})
        return self._approval_out(decided, {})

    # --- memory -------------------------------------------------------------------------------

    def memories(self, grant: Grant, owner: str, *, q: str | None = None, k: int = 10) -> MemoriesOut:
        """An owner's memories, newest first, or the ``k`` nearest in meaning to ``q``."""
        self._owner(grant, owner)
        store = self.stores.memory()
        if store is None:
            return MemoriesOut(owner=owner, query=q, memories=[], available=self.stores.has_memory)
        hits: list[tuple[Any, float | None]]
        if q:
            hits = [(h.memory, h.score) for h in store.search(owner, q, k=k)]
        else:
            hits = [(m, None) for m in reversed(store.list_memories(owner))]
        self._audit(grant, "read_memories", owner, {"results": len(hits), "search": bool(q)})
        return MemoriesOut(owner=owner, query=q or None, memories=[_memory_out(m, s) for m, s in hits])

    def export(self, grant: Grant, owner: str) -> str:
        """Every memory of the owner, as the JSON document of :meth:`MemoryStore.export`."""
        self._owner(grant, owner)
        store = self.stores.memory()
        if store is None:
            return json.dumps({"owner": owner, "count": 0, "memories": []}, indent=2)
        self._audit(grant, "export", owner, None)
        return store.export(owner)

    def erase(
        self, grant: Grant, owner: str, *, confirm: str, memory_id: str | None = None
    ) -> dict[str, Any]:
        """Erase the owner's memories (or one) and return the receipt; ``confirm`` repeats the owner."""
        self._owner(grant, owner)
        if confirm != owner:
            raise InvalidInputError(
                "must repeat the owner's id, exactly: erasure is not undone", field="confirm"
            )
        with self.stores.memory_writer() as store:
            receipt = store.forget_one(owner, memory_id) if memory_id else store.forget(owner)
        self._audit(grant, "forget_memories", owner, {"removed": receipt.removed})
        spans.worker_log.info(
            "memories erased", extra={"status": f"{receipt.removed} removed", "worker": grant.identity}
        )
        return receipt.as_dict()


def api_of(request: Request) -> Api:
    """The :class:`Api` of the app serving ``request`` (``create_app`` leaves it in the app's state)."""
    api: Api = request.app.state.api
    return api


def _audit_log(store: Any) -> AuditLog | None:
    """The audit log beside a SQL workflow store (another backend keeps none here)."""
    db = getattr(store, "db", None)
    return AuditLog(db) if isinstance(db, Database) else None


def _memory_out(memory: Any, score: float | None) -> MemoryOut:
    p = memory.provenance
    state = "current" if memory.is_current else ("superseded" if memory.superseded_by else "duplicate")
    return MemoryOut(
        id=memory.id,
        content=memory.content,
        kind=memory.kind,
        tags=list(memory.tags),
        source=p.source,
        trust=memory.trust,
        session_id=p.session_id,
        run_id=p.run_id,
        event_id=p.event_id,
        created_at=memory.created_at,
        expires_at=memory.expires_at,
        state=state,
        score=score,
    )


__all__ = [
    "STATUSES",
    "Api",
    "ApprovalOut",
    "Decision",
    "EntryOut",
    "MemoriesOut",
    "MemoryOut",
    "ModelCallOut",
    "RunDetail",
    "RunOut",
    "RunsPage",
    "StateOut",
    "api_of",
]
