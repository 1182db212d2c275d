"""The JSON API's routes under ``/api``: one router per concern (runs, approvals, memory).

Every route answers from the app's :class:`~statekeep.web.api.Api` (:func:`~statekeep.web.api.api_of`)
for the caller the guard found (:func:`~statekeep.web.guard.caller`). Endpoints are
plain ``def`` functions: FastAPI runs them in its thread pool, so the blocking store
calls never stall the event loop.
"""

# No ``from __future__ import annotations``: FastAPI reads the endpoints' annotations.
from typing import Annotated, Any

from statekeep._check import MAX_DEPTH, parse
from statekeep._extras import requires
from statekeep.web.access import Grant
from statekeep.web.answers import JSONAnswer
from statekeep.web.api import Api, Decision, api_of
from statekeep.web.guard import caller

with requires("web", "the web console"):
    from fastapi import APIRouter, Depends, Query, Request
    from fastapi.exceptions import RequestValidationError
    from fastapi.responses import Response
    from pydantic import ValidationError

#: Approvals per page of ``GET /api/approvals`` unless ``limit`` says otherwise (at most 1,000).
APPROVALS_PAGE = 100


async def decision_body(request: Request) -> Decision:
    """The body, decoded with its depth checked first: json.loads never meets a nesting it cannot take."""
    data = parse(await request.body(), "body", MAX_DEPTH + 1)  # the result sits one level down
    try:
        return Decision.model_validate(data)
    except ValidationError as exc:
        raise RequestValidationError([{**e, "loc": ("body", *e["loc"])} for e in exc.errors()]) from None


Caller = Annotated[Grant, Depends(caller)]
Served = Annotated[Api, Depends(api_of)]
Body = Annotated[Decision, Depends(decision_body)]

# --- runs -------------------------------------------------------------------------------------

runs = APIRouter()


@runs.get("/me", summary="Who the token names, and its scope")
def me(who: Caller) -> JSONAnswer:
    return JSONAnswer({"identity": who.identity, "scope": who.describe()})


@runs.get("/runs", summary="Runs, newest first, a page at a time, with counts per status")
def list_runs(
    who: Caller,
    api: Served,
    status: Annotated[str | None, Query(description="Only runs in this status.")] = None,
    workflow: Annotated[str | None, Query(description="Only runs of this workflow (agent.<name>).")] = None,
    owner: Annotated[str | None, Query(description="Only the agent runs of this owner.")] = None,
    q: Annotated[str | None, Query(description="Text in the run's id, workflow, input or error.")] = None,
    limit: Annotated[int, Query(ge=1, le=1000, description="Runs per page.")] = 25,
    offset: Annotated[int, Query(ge=0, description="Skip this many newer runs.")] = 0,
) -> JSONAnswer:
    page = api.runs(who, status=status, workflow=workflow, owner=owner, q=q, limit=limit, offset=offset)
    return JSONAnswer(page.model_dump(mode="json"))


@runs.get("/runs/{run_id:path}/timeline", summary="What the run did, in order")
def get_timeline(run_id: str, who: Caller, api: Served) -> JSONAnswer:
    """Steps, model calls, tool calls (idempotency key, ledger status), retries, waits,
    approvals and child runs."""
    return JSONAnswer([e.model_dump(mode="json") for e in api.timeline(who, run_id)])


@runs.get("/runs/{run_id:path}/model-calls", summary="Each model call: the exact context it was sent")
def get_model_calls(run_id: str, who: Caller, api: Served) -> JSONAnswer:
    """Each model call's context as the builder produced it (sections, their tokens and
    messages), its answer and its token usage."""
    return JSONAnswer([c.model_dump(mode="json") for c in api.model_calls(who, run_id)])


@runs.get("/runs/{run_id:path}/states", summary="The run's working-state versions")
def get_states(run_id: str, who: Caller, api: Served) -> JSONAnswer:
    return JSONAnswer([s.model_dump(mode="json") for s in api.states(who, run_id)])


@runs.get("/runs/{run_id:path}/states/diff", summary="A diff between two working-state versions")
def get_state_diff(
    run_id: str,
    who: Caller,
    api: Served,
    a: Annotated[int, Query(ge=1, description="The version to compare from.")],
    b: Annotated[int, Query(ge=1, description="The version to compare with.")],
) -> JSONAnswer:
    return JSONAnswer({"a": a, "b": b, "diff": api.state_diff(who, run_id, a, b)})


@runs.get("/runs/{run_id:path}/states/{version:int}", summary="One working-state version")
def get_state(run_id: str, version: int, who: Caller, api: Served) -> JSONAnswer:
    return JSONAnswer(api.state(who, run_id, version))


@runs.get("/runs/{run_id:path}", summary="A run: status, owner, token usage, children")
def get_run(run_id: str, who: Caller, api: Served) -> JSONAnswer:
    """A run's status and what it waits for. A scoped token reads only runs within its scope."""
    return JSONAnswer(api.run(who, run_id).model_dump(mode="json"))


# --- approvals --------------------------------------------------------------------------------

approvals = APIRouter()


@approvals.get("/approvals", summary="Approvals, oldest first (pending unless status says otherwise)")
def list_approvals(
    request: Request,
    who: Caller,
    api: Served,
    status: Annotated[
        str, Query(description="pending, approved, rejected, expired, withdrawn or all.")
    ] = "pending",
    run_id: Annotated[str | None, Query(description="Only this run's approvals.")] = None,
    kind: Annotated[str | None, Query(description="gate or ambiguous.")] = None,
    action: Annotated[str | None, Query(description="Only approvals of this gated action.")] = None,
    limit: Annotated[int, Query(ge=1, le=1000, description="Approvals per page.")] = APPROVALS_PAGE,
    after: Annotated[str | None, Query(description="The id of the last approval of the page before.")] = None,
) -> JSONAnswer:
    """Pending ones unless ``status`` says otherwise (``all`` for every one), a page at a time.

    The store checks the filters (a bad status or kind is a 422; an unknown
    ``after`` a 404); a scoped token sees only the approvals within its scope.
    A full page has a ``Link`` header to the next one (``rel="next"``: this path and
    query, ``after`` its last approval); the last page has none.
    """
    found = api.approvals(
        who, status=status, run_id=run_id, kind=kind, action=action, limit=limit, after=after
    )
    headers = {}
    if len(found) == limit:
        following = request.url.include_query_params(after=found[-1].approval_id)
        headers["Link"] = f'<{following.path}?{following.query}>; rel="next"'  # relative: proxies
    return JSONAnswer([a.model_dump(mode="json") for a in found], headers=headers)


@approvals.get("/approvals/{approval_id}", summary="One approval, decided or not")
def get_approval(approval_id: str, who: Caller, api: Served) -> JSONAnswer:
    """403 outside the token's scope."""
    return JSONAnswer(api.approval(who, approval_id).model_dump(mode="json"))


@approvals.post("/approvals/{approval_id}/decision", summary="Approve or reject, as the token's person")
def decide(approval_id: str, decision: Body, who: Caller, api: Served) -> JSONAnswer:
    """Record the caller's decision, once: 409 if it was decided, 410 if it expired, 403 out of scope."""
    return JSONAnswer(api.decide(who, approval_id, decision, via="api").model_dump(mode="json"))


# --- memory -----------------------------------------------------------------------------------

memory = APIRouter()


@memory.get("/memory/{owner:path}/export", summary="Every memory of an owner, as a JSON document")
def export_memories(owner: str, who: Caller, api: Served) -> Any:
    return Response(
        api.export(who, owner),
        media_type="application/json",
        headers={"Content-Disposition": 'attachment; filename="memories.json"'},
    )


@memory.get("/memory/{owner:path}", summary="An owner's memories, or a search of them")
def get_memories(
    owner: str,
    who: Caller,
    api: Served,
    q: Annotated[str | None, Query(description="Search by meaning instead of listing.")] = None,
    k: Annotated[int, Query(ge=1, le=100, description="How many results of a search.")] = 10,
) -> JSONAnswer:
    return JSONAnswer(api.memories(who, owner, q=q, k=k).model_dump(mode="json"))


@memory.delete("/memory/{owner:path}", summary="Erase an owner's memories (or one), physically")
def erase_memories(
    owner: str,
    who: Caller,
    api: Served,
    confirm: Annotated[str, Query(description="The owner again: erasure is not undone.")],
    memory_id: Annotated[str | None, Query(description="Erase only this memory.")] = None,
) -> JSONAnswer:
    """Returns the erasure receipt. ``confirm`` must repeat the owner; 409 while a worker holds
    a LanceDB memory folder for writing."""
    return JSONAnswer(api.erase(who, owner, confirm=confirm, memory_id=memory_id))


#: The whole API: every route needs a caller (the guard let none through without one).
router = APIRouter(prefix="/api", dependencies=[Depends(caller)])
router.include_router(runs)
router.include_router(approvals)
router.include_router(memory)

__all__ = ["APPROVALS_PAGE", "approvals", "decision_body", "memory", "router", "runs"]
