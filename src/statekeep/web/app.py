"""The approval webhook: people (or a chat bot acting for them) decide gated runs over HTTP.

Every request but ``/health`` carries ``Authorization: Bearer <token>``; the token
names the person, and that name, never one from the request body, is what a
decision records as ``decided_by``. Decisions make the run runnable; a worker
resumes it. Endpoints are plain ``def`` functions: FastAPI runs them in its thread
pool, so the blocking store calls never stall the event loop.
"""

# No ``from __future__ import annotations``: FastAPI reads the endpoints' annotations,
# which name dependencies local to create_app.
import hashlib
import hmac
import logging
import re
from collections.abc import Mapping
from datetime import datetime
from http import HTTPStatus
from typing import Annotated, Any

from statekeep._text import check_id
from statekeep.audit import AuditLog
from statekeep.db import Database
from statekeep.errors import (
    ApprovalDecidedError,
    ApprovalExpiredError,
    ConfigError,
    InvalidInputError,
    MissingDependencyError,
    NotFoundError,
    StatekeepError,
    StorageError,
)
from statekeep.workflow import RunStatus, WorkflowStore

try:
    from fastapi import APIRouter, Depends, FastAPI, HTTPException, Request
    from fastapi.exceptions import RequestValidationError
    from fastapi.responses import JSONResponse
    from pydantic import BaseModel, ConfigDict, Field, StrictBool
    from starlette.exceptions import HTTPException as StarletteHTTPException
except ImportError as exc:  # pragma: no cover - exercised only without the extra
    raise MissingDependencyError("statekeep[web]", "the approval webhook") from exc

MIN_TOKEN_LENGTH = 16
_TOKEN = re.compile(rf"[!-~]{{{MIN_TOKEN_LENGTH},}}")
_NEED_TOKEN = "a valid bearer token is required"
_CHALLENGE = {"WWW-Authenticate": "Bearer"}
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


def _check_tokens(tokens: Mapping[str, str]) -> dict[str, str]:
    """Identity -> token, validated: every identity storable, every token long, printable and distinct."""
    if not isinstance(tokens, Mapping) or not tokens:
        raise ConfigError("tokens", "{}", "name at least one person and their token")
    checked: dict[str, str] = {}
    for identity, token in tokens.items():
        try:
            if not isinstance(identity, str) or not identity.strip():
                raise InvalidInputError("must be a non-empty string")
            check_id(identity, "identity")
        except InvalidInputError as exc:
            raise ConfigError("tokens", repr(identity), f"an identity {exc}") from None
        if not isinstance(token, str) or not _TOKEN.fullmatch(token):
            raise ConfigError(
                "tokens",
                identity,
                f"the token must be at least {MIN_TOKEN_LENGTH} printable ASCII characters, no spaces",
            )
        checked[identity] = token
    if len(set(checked.values())) != len(checked):
        raise ConfigError("tokens", "(tokens)", "two identities share a token; each needs its own")
    return checked


def _digest(token: str) -> bytes:
    return hashlib.sha256(token.encode("latin-1", "replace")).digest()


def _error(status: int, error: str, detail: str, headers: Mapping[str, str] | None = None) -> JSONResponse:
    return JSONResponse({"error": error, "detail": detail}, status_code=status, headers=dict(headers or {}))


def create_app(store: WorkflowStore, *, tokens: Mapping[str, str]) -> FastAPI:
    """The webhook over ``store``; ``tokens`` maps each person's identity to their bearer token.

    Any token holder may list, read and decide every approval of the store: give
    tokens to the people who may decide, and run one app per store.

    Raises:
        ConfigError: no identities; an identity that is empty or not storable; a token
            shorter than 16 characters, not printable ASCII, or shared.
    """
    if not isinstance(store, WorkflowStore):
        raise InvalidInputError("must be a WorkflowStore", field="store")
    by_digest = [(_digest(token), identity) for identity, token in _check_tokens(tokens).items()]
    db = getattr(store, "db", None)
    audit = AuditLog(db) if isinstance(db, Database) else None  # decisions go to the audit log

    def identify(authorization: str | None) -> str | None:
        """The person whose token the header carries, or None."""
        scheme, _, presented = (authorization or "").partition(" ")
        digest = _digest(presented.strip() if scheme.lower() == "bearer" else "")
        found = None
        for known, identity in by_digest:  # fixed-length digests, every one compared: timing says nothing
            if hmac.compare_digest(known, digest):
                found = identity
        return found

    def caller(request: Request) -> str:
        who = identify(request.headers.get("authorization"))
        if who is None:
            raise HTTPException(401, _NEED_TOKEN, _CHALLENGE)
        return who

    Caller = Annotated[str, Depends(caller)]
    app = FastAPI(title="statekeep approvals", version="1", docs_url=None, redoc_url=None, openapi_url=None)
    api = APIRouter(dependencies=[Depends(caller)])

    @app.exception_handler(StatekeepError)
    def _statekeep_error(request: Request, exc: StatekeepError) -> JSONResponse:
        status = next((code for kind, code in _STATUS if isinstance(exc, kind)), 500)
        if status >= 500:  # the message may name the database; it goes to the log, not the client
            log.error("%s %s failed: %s", request.method, request.url.path, exc, exc_info=exc)
            return _error(status, type(exc).__name__, _UNAVAILABLE if status == 503 else _FAILED)
        return _error(status, type(exc).__name__, str(exc))

    @app.exception_handler(StarletteHTTPException)
    def _http_error(request: Request, exc: StarletteHTTPException) -> JSONResponse:
        return _error(exc.status_code, HTTPStatus(exc.status_code).phrase, str(exc.detail), exc.headers)

    @app.exception_handler(RequestValidationError)
    def _invalid(request: Request, exc: RequestValidationError) -> JSONResponse:
        if identify(request.headers.get("authorization")) is None:  # a stranger learns nothing
            return _error(401, "Unauthorized", _NEED_TOKEN, _CHALLENGE)
        detail = "; ".join(".".join(str(p) for p in e["loc"]) + f": {e['msg']}" for e in exc.errors())
        return _error(422, "InvalidInputError", detail)

    @app.exception_handler(Exception)
    def _unexpected(request: Request, exc: Exception) -> JSONResponse:
        log.error("%s %s failed", request.method, request.url.path, exc_info=exc)
        return _error(500, type(exc).__name__, _FAILED)

    @app.get("/health")
    def health() -> dict[str, bool]:
        """Liveness, without a token: the process answers."""
        return {"ok": True}

    @api.get("/approvals")
    def list_approvals(
        status: str = "pending",
        run_id: str | None = None,
        kind: str | None = None,
        action: str | None = None,
    ) -> list[ApprovalOut]:
        """Approvals, oldest first: pending ones unless ``status`` says otherwise (``all`` for every one).

        The store checks the filters (a bad status or kind is a 422).
        """
        found = store.approvals(
            status=None if status == "all" else status, run_id=run_id, kind=kind, action=action
        )
        return [ApprovalOut.model_validate(a) for a in found]

    @api.get("/approvals/{approval_id}")
    def get_approval(approval_id: str) -> ApprovalOut:
        """One approval, decided or not."""
        return ApprovalOut.model_validate(store.approval(approval_id))

    @api.post("/approvals/{approval_id}/decision")
    def decide(approval_id: str, decision: Decision, who: Caller) -> ApprovalOut:
        """Record the caller's decision, once: 409 if it was decided, 410 if it expired."""
        decided = store.decide(
            approval_id,
            approve=decision.approve,
            by=who,
            comment=decision.comment,
            result=decision.result,
        )
        if audit is not None:
            audit.record(
                who,
                "approve" if decision.approve else "reject",
                approval_id,
                via="webhook",
                detail={"run": decided.run_id},
            )
        return ApprovalOut.model_validate(decided)

    @api.get("/runs/{run_id}")
    def get_run(run_id: str) -> RunOut:
        """A run's status, so a caller can follow what its decision set going."""
        return RunOut.model_validate(store.get(run_id))

    app.include_router(api)
    return app
