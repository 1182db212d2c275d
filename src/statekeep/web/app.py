"""The web console and its API: people look at runs and memories, and decide gated calls, over HTTP.

Every request but ``/health``, the login page and the style sheet needs a
person's token, checked before routing: as ``Authorization: Bearer <token>``
(the API, a chat bot), or as the cookie the login page sets (a browser). Without
one, an API request is a 401 whatever its path, method or body, and a page is a
redirect to the login. The token names the person, and that name, never one
from the request, is what a decision records as ``decided_by``. A token may be
limited to some gates (approval actions) and to some owners (the owner a
:class:`~statekeep.runtime.Runtime` agent run was started for); outside its
scope it lists nothing, and reading or deciding is a 403. Bodies are capped
(64 KiB by default): a longer one is a 413, refused before it is read.

The JSON API lives under ``/api`` and is documented at ``/docs`` (the OpenAPI
document at ``/openapi.json``); the pages (:mod:`statekeep.web.pages`) are
rendered on the server from the same functions, and work without JavaScript.
The approval webhook's first paths (``/approvals``, ``/approvals/{id}``,
``/approvals/{id}/decision``, ``/runs/{id}``) still answer JSON to clients that
do not ask for HTML.

Decisions make the run runnable; a worker resumes it. Endpoints are plain ``def``
functions: FastAPI runs them in its thread pool, so the blocking store calls never
stall the event loop.
"""

# No ``from __future__ import annotations``: FastAPI reads the endpoints' annotations,
# which name dependencies local to create_app.
import json
import logging
import re
from collections.abc import Mapping
from http import HTTPStatus
from typing import Annotated, Any

from statekeep._check import MAX_DEPTH, parse
from statekeep._extras import requires
from statekeep.errors import (
    ApprovalDecidedError,
    ApprovalExpiredError,
    InvalidInputError,
    MemoryLockedError,
    NotFoundError,
    StatekeepError,
    StorageError,
)
from statekeep.web.access import COOKIE, DEFAULT_MAX_BODY, Access, Grant, check_max_body
from statekeep.web.api import Api, ApprovalOut, Decision, RunOut
from statekeep.web.stores import Stores
from statekeep.workflow import WorkflowStore

with requires("web", "the web console"):
    from fastapi import APIRouter, Depends, FastAPI, HTTPException, Query, Request
    from fastapi.exceptions import RequestValidationError
    from fastapi.responses import JSONResponse, PlainTextResponse
    from pydantic import ValidationError
    from starlette.datastructures import Headers
    from starlette.exceptions import HTTPException as StarletteHTTPException
    from starlette.types import ASGIApp, Message, Receive, Scope, Send

_NEED_TOKEN = "a valid bearer token is required"
#: Approvals per page of ``GET /api/approvals`` unless ``limit`` says otherwise (at most 1,000).
APPROVALS_PAGE = 100
_CHALLENGE = {"WWW-Authenticate": "Bearer"}
_TOO_LARGE = "Content Too Large"  # RFC 9110's name; Python's HTTPStatus says "Request Entity Too Large"
_GRANT = "statekeep.grant"  # the ASGI scope key the guard leaves the caller's grant under
_UNAVAILABLE = "the database failed or cannot be reached; the server log says more"
_FAILED = "the request failed; the server log says more"
#: Paths anyone may reach: the login page and what it needs, and liveness.
_OPEN = re.compile(r"/(health|login|static/[\w.-]+|favicon\.ico)")
#: The approval webhook's paths from before /api: JSON for clients that do not ask for HTML.
_WEBHOOK = re.compile(r"/(approvals(/[^/]+(/decision)?)?|runs/[^/]+)")
log = logging.getLogger("statekeep.web")

#: HTTP status for each statekeep error a request can meet; anything else is a 500.
STATUS: list[tuple[type[StatekeepError], int]] = [
    (NotFoundError, 404),
    (ApprovalDecidedError, 409),
    (MemoryLockedError, 409),
    (ApprovalExpiredError, 410),
    (InvalidInputError, 422),
    (StorageError, 503),
]


class _JSON(JSONResponse):
    """JSON with every non-ASCII character escaped: text no UTF-8 encoder takes (a lone surrogate
    stored before it was refused) is shown escaped, as it is stored, instead of failing the answer."""

    def render(self, content: Any) -> bytes:
        return json.dumps(content, allow_nan=False, separators=(",", ":"), default=str).encode("ascii")


def _error(status: int, error: str, detail: str, headers: Mapping[str, str] | None = None) -> _JSON:
    return _JSON({"error": error, "detail": detail}, status_code=status, headers=dict(headers or {}))


def wants_html(scope: Scope, path: str) -> bool:
    """A browser asking for a page (not the API): it gets pages, redirects and HTML errors."""
    accept = Headers(scope=scope).get("accept", "")
    return "text/html" in accept and not path.startswith("/api/") and path != "/api"


class _BodyTooLarge(StarletteHTTPException):
    def __init__(self, limit: int) -> None:
        super().__init__(413, f"the request body is larger than {limit} bytes")


class _Guard:
    """Before any route: a valid token or login (else 401, or the login page), a body within the limit.

    A stranger's request is answered without reading its body or matching its
    path. A declared length over the limit is refused at once; a body sent without
    one is counted as it is read, and refused when it passes the limit.
    """

    def __init__(self, app: ASGIApp, access: Access, max_body: int) -> None:
        self.app = app
        self.access = access
        self.max_body = max_body

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        root = scope.get("root_path", "")
        path = scope["path"].removeprefix(root) or "/"
        if _OPEN.fullmatch(path):
            await self.app(scope, receive, send)
            return
        headers = Headers(scope=scope)
        grant = self.access.by_header(headers.get("authorization"))
        by_cookie = grant is None and "authorization" not in headers
        if by_cookie:
            grant = self.access.by_cookie(_cookie(headers.get("cookie", ""), COOKIE))
        if grant is None:
            if wants_html(scope, path) and scope["method"] in ("GET", "HEAD"):
                query = scope.get("query_string", b"").decode("latin-1")
                back = path + (f"?{query}" if query else "")
                target = f"{root}/login?next={_quote(back)}" if back != "/" else f"{root}/login"
                await _redirect(target)(scope, receive, send)
                return
            await _error(401, "Unauthorized", _NEED_TOKEN, _CHALLENGE)(scope, receive, send)
            return
        length = headers.get("content-length")
        if length is not None and (not length.isdigit() or int(length) > self.max_body):
            too_large = length.isdigit()
            status, error = (413, _TOO_LARGE) if too_large else (400, "Bad Request")
            detail = _BodyTooLarge(self.max_body).detail if too_large else "Content-Length is not a number"
            await _error(status, error, detail)(scope, receive, send)
            return
        api = path.startswith("/api/") or (
            _WEBHOOK.fullmatch(path) is not None and not wants_html(scope, path)
        )
        if by_cookie and api and scope["method"] not in ("GET", "HEAD"):
            # the pages change things through their own forms, which carry a CSRF field
            detail = "the API changes nothing for a login cookie: send the bearer token"
            await _error(403, "Forbidden", detail)(scope, receive, send)
            return
        scope[_GRANT] = grant
        if _WEBHOOK.fullmatch(path) and not wants_html(scope, path):  # the webhook's first paths
            scope = {**scope, "path": f"{root}/api{path}", "raw_path": f"{root}/api{path}".encode()}
        read = 0

        async def capped() -> Message:
            nonlocal read
            message = await receive()
            if message["type"] == "http.request":
                read += len(message.get("body", b""))
                if read > self.max_body:
                    raise _BodyTooLarge(self.max_body)
            return message

        await self.app(scope, capped, send)


def _cookie(header: str, name: str) -> str | None:
    for part in header.split(";"):
        key, _, value = part.strip().partition("=")
        if key == name:
            return value
    return None


def _quote(path: str) -> str:
    from urllib.parse import quote

    return quote(path, safe="")


def _redirect(url: str) -> PlainTextResponse:
    return PlainTextResponse("see the login page", status_code=303, headers={"Location": url})


def caller(request: Request) -> Grant:
    """The grant the guard found for this request."""
    grant = request.scope.get(_GRANT)
    if not isinstance(grant, Grant):  # the guard lets no request through without one
        raise HTTPException(401, _NEED_TOKEN, _CHALLENGE)
    return grant


def check_config(tokens: Mapping[str, Any], max_body: int = DEFAULT_MAX_BODY) -> None:
    """Check the tokens and body limit as :func:`create_app` would, before opening any store.

    Raises:
        ConfigError: see :func:`create_app`.
    """
    Access(tokens)
    check_max_body(max_body)


def create_app(
    store: WorkflowStore,
    *,
    tokens: Mapping[str, str | Mapping[str, Any]],
    max_body: int = DEFAULT_MAX_BODY,
    stores: Stores | None = None,
) -> FastAPI:
    """The console and API over ``store``; ``tokens`` maps each person's identity to their bearer token.

    A token is a string (it may list, read and decide everything of the
    store), or ``{"token": ..., "gates": [...], "owners": [...]}`` to limit it to
    approvals of those actions and to runs and memories of those owners (either
    key may be left out: no limit on that side). An owner is the one a Runtime
    agent run was started for; runs of other workflows have no owner, so an
    owner-limited token never sees them. Bodies longer than ``max_body`` bytes
    are refused (413). ``stores`` adds working-state versions and memory to the
    console (:meth:`Stores.open`); without it, runs and approvals are shown.
    Run one app per store.

    Raises:
        ConfigError: no identities; an identity that is empty or not storable; a token
            shorter than 16 characters, not printable ASCII, or shared; a scope that is
            empty, not a list of names, or misspelt; ``max_body`` not a positive int.
    """
    if not isinstance(store, WorkflowStore):
        raise InvalidInputError("must be a WorkflowStore", field="store")
    access = Access(tokens)
    limit = check_max_body(max_body)
    api = Api(stores if stores is not None else Stores(store), access)

    async def decision_body(request: Request) -> Decision:
        """The body, decoded with its depth checked first: json.loads never meets a nesting it cannot take."""
        data = parse(await request.body(), "body", MAX_DEPTH + 1)  # the result sits one level down
        try:
            return Decision.model_validate(data)
        except ValidationError as exc:
            raise RequestValidationError([{**e, "loc": ("body", *e["loc"])} for e in exc.errors()]) from None

    Caller = Annotated[Grant, Depends(caller)]
    Body = Annotated[Decision, Depends(decision_body)]
    app = FastAPI(
        title="statekeep console API",
        version="1",
        description="Runs, approvals and memories of a statekeep deployment. Every request needs "
        "`Authorization: Bearer <token>` (or the console's login cookie).",
        docs_url=None,
        redoc_url=None,
        openapi_url="/openapi.json",
        default_response_class=_JSON,
    )
    app.add_middleware(_Guard, access=access, max_body=limit)
    app.state.api = api
    router = APIRouter(prefix="/api", dependencies=[Depends(caller)])

    @app.exception_handler(StatekeepError)
    def _statekeep_error(request: Request, exc: StatekeepError) -> Any:
        status = next((code for kind, code in STATUS if isinstance(exc, kind)), 500)
        if status >= 500:  # the message may name the database; it goes to the log, not the client
            log.error("%s %s failed: %s", request.method, request.url.path, exc, exc_info=exc)
            detail = _UNAVAILABLE if status == 503 else _FAILED
        else:
            detail = str(exc)
        return _answer(request, status, type(exc).__name__, detail)

    @app.exception_handler(StarletteHTTPException)
    def _http_error(request: Request, exc: StarletteHTTPException) -> Any:
        error = _TOO_LARGE if exc.status_code == 413 else HTTPStatus(exc.status_code).phrase
        return _answer(request, exc.status_code, error, str(exc.detail), exc.headers)

    @app.exception_handler(RequestValidationError)
    def _invalid(request: Request, exc: RequestValidationError) -> Any:
        detail = "; ".join(".".join(str(p) for p in e["loc"]) + f": {e['msg']}" for e in exc.errors())
        return _answer(request, 422, "InvalidInputError", detail)

    @app.exception_handler(Exception)
    def _unexpected(request: Request, exc: Exception) -> Any:
        log.error("%s %s failed", request.method, request.url.path, exc_info=exc)
        return _answer(request, 500, type(exc).__name__, _FAILED)

    def _answer(
        request: Request, status: int, error: str, detail: str, headers: Mapping[str, str] | None = None
    ) -> Any:
        root = request.scope.get("root_path", "")
        if wants_html(request.scope, request.url.path.removeprefix(root)):
            from statekeep.web.pages import error_page

            return error_page(request, status, error, detail, headers)
        return _error(status, error, detail, headers)

    @app.get("/health", include_in_schema=False)
    def health() -> dict[str, bool]:
        """Liveness, without a token: the process answers."""
        return {"ok": True}

    # --- runs -------------------------------------------------------------------------------

    @router.get("/me", summary="Who the token names, and its scope")
    def me(who: Caller) -> _JSON:
        return _JSON({"identity": who.identity, "scope": who.describe()})

    @router.get("/runs", summary="Runs, newest first, a page at a time, with counts per status")
    def list_runs(
        who: Caller,
        status: Annotated[str | None, Query(description="Only runs in this status.")] = None,
        workflow: Annotated[
            str | None, Query(description="Only runs of this workflow (agent.<name>).")
        ] = None,
        owner: Annotated[str | None, Query(description="Only the agent runs of this owner.")] = None,
        q: Annotated[str | None, Query(description="Text in the run's id, workflow, input or error.")] = None,
        limit: Annotated[int, Query(ge=1, le=1000, description="Runs per page.")] = 25,
        offset: Annotated[int, Query(ge=0, description="Skip this many newer runs.")] = 0,
    ) -> _JSON:
        page = api.runs(who, status=status, workflow=workflow, owner=owner, q=q, limit=limit, offset=offset)
        return _JSON(page.model_dump(mode="json"))

    @router.get("/runs/{run_id:path}/timeline", summary="What the run did, in order")
    def get_timeline(run_id: str, who: Caller) -> _JSON:
        """Steps, model calls, tool calls (idempotency key, ledger status), retries, waits,
        approvals and child runs."""
        return _JSON([e.model_dump(mode="json") for e in api.timeline(who, run_id)])

    @router.get("/runs/{run_id:path}/model-calls", summary="Each model call: the exact context it was sent")
    def get_model_calls(run_id: str, who: Caller) -> _JSON:
        """Each model call's context as the builder produced it (sections, their tokens and
        messages), its answer and its token usage."""
        return _JSON([c.model_dump(mode="json") for c in api.model_calls(who, run_id)])

    @router.get("/runs/{run_id:path}/states", summary="The run's working-state versions")
    def get_states(run_id: str, who: Caller) -> _JSON:
        return _JSON([s.model_dump(mode="json") for s in api.states(who, run_id)])

    @router.get("/runs/{run_id:path}/states/diff", summary="A diff between two working-state versions")
    def get_state_diff(
        run_id: str,
        who: Caller,
        a: Annotated[int, Query(ge=1, description="The version to compare from.")],
        b: Annotated[int, Query(ge=1, description="The version to compare with.")],
    ) -> _JSON:
        return _JSON({"a": a, "b": b, "diff": api.state_diff(who, run_id, a, b)})

    @router.get("/runs/{run_id:path}/states/{version:int}", summary="One working-state version")
    def get_state(run_id: str, version: int, who: Caller) -> _JSON:
        return _JSON(api.state(who, run_id, version))

    @router.get("/runs/{run_id:path}", summary="A run: status, owner, token usage, children")
    def get_run(run_id: str, who: Caller) -> _JSON:
        """A run's status and what it waits for. A scoped token reads only runs within its scope."""
        return _JSON(api.run(who, run_id).model_dump(mode="json"))

    # --- approvals ----------------------------------------------------------------------------

    @router.get("/approvals", summary="Approvals, oldest first (pending unless status says otherwise)")
    def list_approvals(
        request: Request,
        who: Caller,
        status: Annotated[
            str, Query(description="pending, approved, rejected, expired, withdrawn or all.")
        ] = "pending",
        run_id: Annotated[str | None, Query(description="Only this run's approvals.")] = None,
        kind: Annotated[str | None, Query(description="gate or ambiguous.")] = None,
        action: Annotated[str | None, Query(description="Only approvals of this gated action.")] = None,
        limit: Annotated[int, Query(ge=1, le=1000, description="Approvals per page.")] = APPROVALS_PAGE,
        after: Annotated[
            str | None, Query(description="The id of the last approval of the page before.")
        ] = None,
    ) -> _JSON:
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
        return _JSON([a.model_dump(mode="json") for a in found], headers=headers)

    @router.get("/approvals/{approval_id}", summary="One approval, decided or not")
    def get_approval(approval_id: str, who: Caller) -> _JSON:
        """403 outside the token's scope."""
        return _JSON(api.approval(who, approval_id).model_dump(mode="json"))

    @router.post("/approvals/{approval_id}/decision", summary="Approve or reject, as the token's person")
    def decide(approval_id: str, decision: Body, who: Caller) -> _JSON:
        """Record the caller's decision, once: 409 if it was decided, 410 if it expired, 403 out of scope."""
        return _JSON(api.decide(who, approval_id, decision, via="api").model_dump(mode="json"))

    # --- memory -------------------------------------------------------------------------------

    @router.get("/memory/{owner:path}/export", summary="Every memory of an owner, as a JSON document")
    def export_memories(owner: str, who: Caller) -> Any:
        from fastapi.responses import Response

        return Response(
            api.export(who, owner),
            media_type="application/json",
            headers={"Content-Disposition": 'attachment; filename="memories.json"'},
        )

    @router.get("/memory/{owner:path}", summary="An owner's memories, or a search of them")
    def get_memories(
        owner: str,
        who: Caller,
        q: Annotated[str | None, Query(description="Search by meaning instead of listing.")] = None,
        k: Annotated[int, Query(ge=1, le=100, description="How many results of a search.")] = 10,
    ) -> _JSON:
        return _JSON(api.memories(who, owner, q=q, k=k).model_dump(mode="json"))

    @router.delete("/memory/{owner:path}", summary="Erase an owner's memories (or one), physically")
    def erase_memories(
        owner: str,
        who: Caller,
        confirm: Annotated[str, Query(description="The owner again: erasure is not undone.")],
        memory_id: Annotated[str | None, Query(description="Erase only this memory.")] = None,
    ) -> _JSON:
        """Returns the erasure receipt. ``confirm`` must repeat the owner; 409 while a worker holds
        a LanceDB memory folder for writing."""
        return _JSON(api.erase(who, owner, confirm=confirm, memory_id=memory_id))

    app.include_router(router)
    from statekeep.web import pages

    pages.add_pages(app, api)
    return app


__all__ = ["ApprovalOut", "Decision", "RunOut", "Stores", "check_config", "create_app", "wants_html"]
