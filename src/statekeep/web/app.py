"""The approval webhook: people (or a chat bot acting for them) decide gated runs over HTTP.

Every request but ``/health`` carries ``Authorization: Bearer <token>``, checked
before anything else: without a valid token every request is a 401, whatever its
path, method or body. The token names the person, and that name, never one from
the request body, is what a decision records as ``decided_by``. A token may be
limited to some gates (approval actions) and to some owners (the owner a
:class:`~statekeep.runtime.Runtime` agent run was started for); outside its scope
it lists nothing, and reading or deciding is a 403. Bodies are capped (64 KiB by
default): a longer one is a 413, refused before it is read.

Decisions make the run runnable; a worker resumes it. Endpoints are plain ``def``
functions: FastAPI runs them in its thread pool, so the blocking store calls never
stall the event loop.
"""

# No ``from __future__ import annotations``: FastAPI reads the endpoints' annotations,
# which name dependencies local to create_app.
import hashlib
import hmac
import json
import logging
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import datetime
from http import HTTPStatus
from typing import Annotated, Any

from statekeep._extras import requires
from statekeep._json import MAX_DEPTH, parse
from statekeep._text import check_id
from statekeep.audit import AuditLog
from statekeep.db import Database
from statekeep.errors import (
    ApprovalDecidedError,
    ApprovalExpiredError,
    ConfigError,
    InvalidInputError,
    NotFoundError,
    StatekeepError,
    StorageError,
)
from statekeep.workflow import Approval, Run, RunStatus, WorkflowStore

with requires("web", "the approval webhook"):
    from fastapi import APIRouter, Depends, FastAPI, HTTPException, Request
    from fastapi.exceptions import RequestValidationError
    from fastapi.responses import JSONResponse
    from pydantic import BaseModel, ConfigDict, Field, StrictBool, ValidationError
    from starlette.datastructures import Headers
    from starlette.exceptions import HTTPException as StarletteHTTPException
    from starlette.types import ASGIApp, Message, Receive, Scope, Send

MIN_TOKEN_LENGTH = 16
#: The largest request body the webhook reads, unless ``create_app(max_body=...)`` says otherwise.
DEFAULT_MAX_BODY = 64 * 1024
_TOKEN = re.compile(rf"[!-~]{{{MIN_TOKEN_LENGTH},}}")
_SCOPES = ("gates", "owners")
_NEED_TOKEN = "a valid bearer token is required"
_CHALLENGE = {"WWW-Authenticate": "Bearer"}
_TOO_LARGE = "Content Too Large"  # RFC 9110's name; Python's HTTPStatus says "Request Entity Too Large"
_GRANT = "statekeep.grant"  # the ASGI scope key the guard leaves the caller's grant under
_UNAVAILABLE = "the database failed or cannot be reached; the server log says more"
_FAILED = "the request failed; the server log says more"
log = logging.getLogger("statekeep.web")

#: HTTP status for each statekeep error a request can meet; anything else is a 500.
_STATUS: list[tuple[type[StatekeepError], int]] = [
    (NotFoundError, 404),
    (ApprovalDecidedError, 409),
    (ApprovalExpiredError, 410),
    (InvalidInputError, 422),
    (StorageError, 503),
]


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
    """An approval as the webhook shows it (read from a :class:`~statekeep.workflow.Approval`)."""

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


@dataclass(frozen=True)
class Grant:
    """What one bearer token allows: who it names, and the gates and owners it is limited to.

    ``None`` means no limit; a set limits the token to approvals whose action is
    one of ``gates`` and (both, when both are set) whose run's owner is one of ``owners``.
    """

    identity: str
    gates: frozenset[str] | None = None
    owners: frozenset[str] | None = None

    @property
    def scoped(self) -> bool:
        return self.gates is not None or self.owners is not None

    def allows(self, action: str, owner: str | None) -> bool:
        """True if an approval of ``action``, in a run of ``owner`` (None: no owner), is in scope."""
        if self.gates is not None and action not in self.gates:
            return False
        return self.owners is None or (owner is not None and owner in self.owners)


def _check_tokens(tokens: Mapping[str, Any]) -> list[tuple[str, Grant]]:
    """(token, grant) pairs: identities storable, tokens long, printable and distinct, scopes sound."""
    if not isinstance(tokens, Mapping) or not tokens:
        raise ConfigError("tokens", "{}", "name at least one person and their token")
    checked: list[tuple[str, Grant]] = []
    for identity, entry in tokens.items():
        try:
            if not isinstance(identity, str) or not identity.strip():
                raise InvalidInputError("must be a non-empty string")
            check_id(identity, "identity")
        except InvalidInputError as exc:
            raise ConfigError("tokens", repr(identity), f"an identity {exc}") from None
        token, scope = _entry(identity, entry)
        if not isinstance(token, str) or not _TOKEN.fullmatch(token):
            raise ConfigError(
                "tokens",
                identity,
                f"the token must be at least {MIN_TOKEN_LENGTH} printable ASCII characters, no spaces",
            )
        checked.append((token, Grant(identity, **scope)))
    if len({token for token, _ in checked}) != len(checked):
        raise ConfigError("tokens", "(tokens)", "two identities share a token; each needs its own")
    return checked


def _entry(identity: str, entry: object) -> tuple[object, dict[str, frozenset[str]]]:
    """A token entry: the token itself, or ``{"token": ..., "gates": [...], "owners": [...]}``."""
    if not isinstance(entry, Mapping):
        return entry, {}
    if "token" not in entry:
        raise ConfigError(
            "tokens", identity, 'give a token, or {"token": ..., "gates": [...], "owners": [...]}'
        )
    unknown = sorted(str(k) for k in entry if k not in ("token", *_SCOPES))
    if unknown:
        raise ConfigError(
            "tokens", identity, f"unknown key {unknown[0]!r}; a token entry has token, {_SCOPES}"
        )
    scope: dict[str, frozenset[str]] = {}
    for name in _SCOPES:
        if name not in entry:
            continue
        values = entry[name]
        if not isinstance(values, list | tuple) or not values:
            raise ConfigError(
                "tokens", identity, f"{name} must be a non-empty list of names (leave it out for no limit)"
            )
        try:
            scope[name] = frozenset(check_id(v, name) for v in values)
        except InvalidInputError as exc:
            raise ConfigError("tokens", identity, f"{name}: every entry {exc}") from None
    return entry["token"], scope


def _check_max_body(max_body: object) -> int:
    if isinstance(max_body, bool) or not isinstance(max_body, int) or max_body < 1:
        raise ConfigError("max_body", repr(max_body), "must be a whole number of bytes, at least 1")
    return max_body


def _digest(token: str) -> bytes:
    return hashlib.sha256(token.encode("latin-1", "replace")).digest()


class _JSON(JSONResponse):
    """JSON with every non-ASCII character escaped: text no UTF-8 encoder takes (a lone surrogate
    stored before it was refused) is shown escaped, as it is stored, instead of failing the answer."""

    def render(self, content: Any) -> bytes:
        return json.dumps(content, allow_nan=False, separators=(",", ":")).encode("ascii")


def _error(status: int, error: str, detail: str, headers: Mapping[str, str] | None = None) -> _JSON:
    return _JSON({"error": error, "detail": detail}, status_code=status, headers=dict(headers or {}))


def _owner(run: Run) -> str | None:
    """The owner a run holds data of (``Run.owner``); for an older agent run, from its input.

    A :class:`~statekeep.runtime.Runtime` runs an agent as the workflow
    ``agent.<name>`` with the input ``(owner, session_id, task)``, and that first
    argument is the owner.
    """
    if run.owner is not None:
        return run.owner
    args = (run.input or {}).get("args") if isinstance(run.input, dict) else None
    if run.workflow.startswith("agent.") and isinstance(args, list) and args and isinstance(args[0], str):
        return args[0]
    return None


class _BodyTooLarge(StarletteHTTPException):
    def __init__(self, limit: int) -> None:
        super().__init__(413, f"the request body is larger than {limit} bytes")


class _Guard:
    """Before any route: a valid token (else 401), and a body within the limit (else 413).

    A stranger's request is answered without reading its body or matching its
    path. A declared length over the limit is refused at once; a body sent without
    one is counted as it is read, and refused when it passes the limit.
    """

    def __init__(self, app: ASGIApp, identify: Callable[[str | None], Grant | None], max_body: int) -> None:
        self.app = app
        self.identify = identify
        self.max_body = max_body

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["path"].removeprefix(scope.get("root_path", "")) == "/health":
            await self.app(scope, receive, send)
            return
        headers = Headers(scope=scope)
        grant = self.identify(headers.get("authorization"))
        if grant is None:
            await _error(401, "Unauthorized", _NEED_TOKEN, _CHALLENGE)(scope, receive, send)
            return
        length = headers.get("content-length")
        if length is not None and (not length.isdigit() or int(length) > self.max_body):
            too_large = length.isdigit()
            status, error = (413, _TOO_LARGE) if too_large else (400, "Bad Request")
            detail = _BodyTooLarge(self.max_body).detail if too_large else "Content-Length is not a number"
            await _error(status, error, detail)(scope, receive, send)
            return
        scope[_GRANT] = grant
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


def create_app(
    store: WorkflowStore, *, tokens: Mapping[str, str | Mapping[str, Any]], max_body: int = DEFAULT_MAX_BODY
) -> FastAPI:
    """The webhook over ``store``; ``tokens`` maps each person's identity to their bearer token.

    A token is a string (it may list, read and decide every approval of the
    store), or ``{"token": ..., "gates": [...], "owners": [...]}`` to limit it to
    approvals of those actions and of runs of those owners (either key may be
    left out: no limit on that side). An owner is the one a Runtime agent run was
    started for; runs of other workflows have no owner, so an owner-limited token
    never sees them. Bodies longer than ``max_body`` bytes are refused (413).
    Run one app per store.

    Raises:
        ConfigError: no identities; an identity that is empty or not storable; a token
            shorter than 16 characters, not printable ASCII, or shared; a scope that is
            empty, not a list of names, or misspelt; ``max_body`` not a positive int.
    """
    if not isinstance(store, WorkflowStore):
        raise InvalidInputError("must be a WorkflowStore", field="store")
    by_digest = [(_digest(token), grant) for token, grant in _check_tokens(tokens)]
    limit = _check_max_body(max_body)
    db = getattr(store, "db", None)
    audit = AuditLog(db) if isinstance(db, Database) else None  # decisions go to the audit log

    def identify(authorization: str | None) -> Grant | None:
        """The grant of the token the header carries, or None."""
        scheme, _, presented = (authorization or "").partition(" ")
        digest = _digest(presented.strip() if scheme.lower() == "bearer" else "")
        found = None
        for known, grant in by_digest:  # fixed-length digests, every one compared: timing says nothing
            if hmac.compare_digest(known, digest):
                found = grant
        return found

    def caller(request: Request) -> Grant:
        grant = request.scope.get(_GRANT)
        if not isinstance(grant, Grant):  # the guard lets no request through without one
            raise HTTPException(401, _NEED_TOKEN, _CHALLENGE)
        return grant

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
        title="statekeep approvals",
        version="1",
        docs_url=None,
        redoc_url=None,
        openapi_url=None,
        default_response_class=_JSON,
    )
    app.add_middleware(_Guard, identify=identify, max_body=limit)
    api = APIRouter(dependencies=[Depends(caller)])

    def owners_of(grant: Grant) -> Callable[[str], str | None]:
        """Each run's owner, read once per request (only when the grant is limited to owners)."""
        known: dict[str, str | None] = {}

        def owner(run_id: str) -> str | None:
            if grant.owners is None:
                return None
            if run_id not in known:
                known[run_id] = _owner(store.get(run_id))
            return known[run_id]

        return owner

    def allowed(grant: Grant, approval: Approval, owner: Callable[[str], str | None]) -> bool:
        return not grant.scoped or grant.allows(approval.action, owner(approval.run_id))

    def in_scope(grant: Grant, approval: Approval) -> Approval:
        if not allowed(grant, approval, owners_of(grant)):
            raise HTTPException(
                403, f"approval {approval.approval_id!r} ({approval.action!r}) is outside this token's scope"
            )
        return approval

    def out(approval: Approval) -> dict[str, Any]:
        return ApprovalOut.model_validate(approval).model_dump(mode="json")

    @app.exception_handler(StatekeepError)
    def _statekeep_error(request: Request, exc: StatekeepError) -> _JSON:
        status = next((code for kind, code in _STATUS if isinstance(exc, kind)), 500)
        if status >= 500:  # the message may name the database; it goes to the log, not the client
            log.error("%s %s failed: %s", request.method, request.url.path, exc, exc_info=exc)
            return _error(status, type(exc).__name__, _UNAVAILABLE if status == 503 else _FAILED)
        return _error(status, type(exc).__name__, str(exc))

    @app.exception_handler(StarletteHTTPException)
    def _http_error(request: Request, exc: StarletteHTTPException) -> _JSON:
        error = _TOO_LARGE if exc.status_code == 413 else HTTPStatus(exc.status_code).phrase
        return _error(exc.status_code, error, str(exc.detail), exc.headers)

    @app.exception_handler(RequestValidationError)
    def _invalid(request: Request, exc: RequestValidationError) -> _JSON:
        detail = "; ".join(".".join(str(p) for p in e["loc"]) + f": {e['msg']}" for e in exc.errors())
        return _error(422, "InvalidInputError", detail)

    @app.exception_handler(Exception)
    def _unexpected(request: Request, exc: Exception) -> _JSON:
        log.error("%s %s failed", request.method, request.url.path, exc_info=exc)
        return _error(500, type(exc).__name__, _FAILED)

    @app.get("/health")
    def health() -> dict[str, bool]:
        """Liveness, without a token: the process answers."""
        return {"ok": True}

    @api.get("/approvals")
    def list_approvals(
        who: Caller,
        status: str = "pending",
        run_id: str | None = None,
        kind: str | None = None,
        action: str | None = None,
    ) -> _JSON:
        """Approvals, oldest first: pending ones unless ``status`` says otherwise (``all`` for every one).

        The store checks the filters (a bad status or kind is a 422); a scoped
        token sees only the approvals within its scope.
        """
        found = store.approvals(
            status=None if status == "all" else status, run_id=run_id, kind=kind, action=action
        )
        owner = owners_of(who)
        return _JSON([out(a) for a in found if allowed(who, a, owner)])

    @api.get("/approvals/{approval_id}")
    def get_approval(approval_id: str, who: Caller) -> _JSON:
        """One approval, decided or not (403 outside the token's scope)."""
        return _JSON(out(in_scope(who, store.approval(approval_id))))

    @api.post("/approvals/{approval_id}/decision")
    def decide(approval_id: str, decision: Body, who: Caller) -> _JSON:
        """Record the caller's decision, once: 409 if it was decided, 410 if it expired, 403 out of scope."""
        in_scope(who, store.approval(approval_id))
        decided = store.decide(
            approval_id,
            approve=decision.approve,
            by=who.identity,
            comment=decision.comment,
            result=decision.result,
        )
        if audit is not None:
            audit.record(
                who.identity,
                "approve" if decision.approve else "reject",
                approval_id,
                via="webhook",
                detail={"run": decided.run_id},
            )
        return _JSON(out(decided))

    @api.get("/runs/{run_id}")
    def get_run(run_id: str, who: Caller) -> _JSON:
        """A run's status, so a caller can follow what its decision set going.

        A scoped token reads only runs with an approval within its scope.
        """
        run = store.get(run_id)
        if who.scoped:
            owner = owners_of(who)
            if not any(allowed(who, a, owner) for a in store.approvals(status=None, run_id=run_id)):
                raise HTTPException(403, f"run {run_id!r} has no approval within this token's scope")
        return _JSON(RunOut.model_validate(run).model_dump(mode="json"))

    app.include_router(api)
    return app
