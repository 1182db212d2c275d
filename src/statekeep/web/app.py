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

Decisions make the run runnable; a worker resumes it.

:func:`create_app` puts the parts together: the guard (:mod:`statekeep.web.guard`),
the API's routers (:mod:`statekeep.web.routes`), the pages' router
(:mod:`statekeep.web.pages`), and the answers to errors below.
"""

import logging
from collections.abc import Mapping
from http import HTTPStatus
from typing import Any

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
from statekeep.web import pages, routes
from statekeep.web.access import DEFAULT_MAX_BODY, Access, check_max_body
from statekeep.web.answers import TOO_LARGE, JSONAnswer, error_answer, wants_html
from statekeep.web.api import Api
from statekeep.web.guard import Guard
from statekeep.web.stores import Stores
from statekeep.workflow import WorkflowStore

with requires("web", "the web console"):
    from fastapi import FastAPI, Request
    from fastapi.exceptions import RequestValidationError
    from fastapi.staticfiles import StaticFiles
    from starlette.exceptions import HTTPException as StarletteHTTPException

_UNAVAILABLE = "the database failed or cannot be reached; the server log says more"
_FAILED = "the request failed; the server log says more"
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


def _statekeep_error(request: Request, exc: Exception) -> Any:
    status = next((code for kind, code in STATUS if isinstance(exc, kind)), 500)
    if status >= 500:  # the message may name the database; it goes to the log, not the client
        log.error("%s %s failed: %s", request.method, request.url.path, exc, exc_info=exc)
        detail = _UNAVAILABLE if status == 503 else _FAILED
    else:
        detail = str(exc)
    return _answer(request, status, type(exc).__name__, detail)


def _http_error(request: Request, exc: Exception) -> Any:
    assert isinstance(exc, StarletteHTTPException)  # registered for it alone
    error = TOO_LARGE if exc.status_code == 413 else HTTPStatus(exc.status_code).phrase
    return _answer(request, exc.status_code, error, str(exc.detail), exc.headers)


def _invalid(request: Request, exc: Exception) -> Any:
    assert isinstance(exc, RequestValidationError)  # registered for it alone
    detail = "; ".join(".".join(str(p) for p in e["loc"]) + f": {e['msg']}" for e in exc.errors())
    return _answer(request, 422, "InvalidInputError", detail)


def _unexpected(request: Request, exc: Exception) -> Any:
    log.error("%s %s failed", request.method, request.url.path, exc_info=exc)
    return _answer(request, 500, type(exc).__name__, _FAILED)


def _answer(
    request: Request, status: int, error: str, detail: str, headers: Mapping[str, str] | None = None
) -> Any:
    """An error as a page for a browser, as JSON for the API."""
    root = request.scope.get("root_path", "")
    if wants_html(request.scope, request.url.path.removeprefix(root)):
        return pages.error_page(request, status, error, detail, headers)
    return error_answer(status, error, detail, headers)


def health() -> dict[str, bool]:
    """Liveness, without a token: the process answers."""
    return {"ok": True}


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
    app = FastAPI(
        title="statekeep console API",
        version="1",
        description="Runs, approvals and memories of a statekeep deployment. Every request needs "
        "`Authorization: Bearer <token>` (or the console's login cookie).",
        docs_url=None,
        redoc_url=None,
        openapi_url="/openapi.json",
        default_response_class=JSONAnswer,
    )
    app.add_middleware(Guard, access=access, max_body=limit)
    app.state.api = api  # what the routes answer from (statekeep.web.api.api_of)
    app.add_exception_handler(StatekeepError, _statekeep_error)
    app.add_exception_handler(StarletteHTTPException, _http_error)
    app.add_exception_handler(RequestValidationError, _invalid)
    app.add_exception_handler(Exception, _unexpected)
    app.add_api_route("/health", health, methods=["GET"], include_in_schema=False)
    app.include_router(routes.router)
    app.mount("/static", StaticFiles(packages=[("statekeep.web", "static")]), name="static")
    app.include_router(pages.router)
    return app


__all__ = ["STATUS", "check_config", "create_app"]
