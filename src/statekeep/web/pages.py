"""The console's pages: HTML rendered on the server from :class:`~statekeep.web.api.Api`, no JavaScript.

Templates autoescape everything; every stored string also goes through
:func:`~statekeep._literal.visible` (control characters, ANSI escapes and bidi
overrides shown as escapes), and arguments are shown as indented JSON in
``<pre>``: text, never markup. Pages are served with a Content-Security-Policy
that allows no script at all. Forms that change something carry a CSRF field.
"""

from __future__ import annotations

from collections.abc import Mapping
from datetime import datetime
from typing import Annotated, Any
from urllib.parse import parse_qs, urlencode

from fastapi import APIRouter, Depends, HTTPException, Query, Request
from fastapi.responses import HTMLResponse, RedirectResponse, Response
from jinja2 import Environment, PackageLoader, StrictUndefined

from statekeep._literal import pretty, visible
from statekeep.errors import InvalidInputError
from statekeep.web.access import COOKIE, SESSION_SECONDS, Grant
from statekeep.web.api import STATUSES, Api, Decision, api_of
from statekeep.web.guard import GRANT, caller

#: No script, no frames, no form posting elsewhere: defence in depth under the escaping.
CSP = (
    "default-src 'none'; style-src 'self'; img-src 'self' data:; form-action 'self'; "
    "frame-ancestors 'none'; base-uri 'none'"
)
_HEADERS = {
    "Content-Security-Policy": CSP,
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "same-origin",
    "Cache-Control": "no-store",
}
PAGE = 25
#: Approvals per page of the console's list (oldest first; a full page links to the next).
APPROVALS_PAGE = 100


def _when(value: datetime | None) -> str:
    return "-" if value is None else f"{value:%Y-%m-%d %H:%M:%S} UTC"


def _text(value: Any) -> str:
    """A stored value as text: strings with invisible characters escaped; others as JSON."""
    if value is None:
        return "-"
    return visible(value) if isinstance(value, str) else pretty(value)


env = Environment(
    loader=PackageLoader("statekeep.web", "templates"),
    autoescape=True,  # every template, whatever its name
    undefined=StrictUndefined,
    trim_blocks=True,
    lstrip_blocks=True,
)
env.filters.update(v=_text, pretty=pretty, when=_when)


def _root(request: Request) -> str:
    return str(request.scope.get("root_path", ""))


def render(
    request: Request,
    template: str,
    http_status: int = 200,
    headers: Mapping[str, str] | None = None,
    **context: Any,
) -> HTMLResponse:
    """A page, with the caller (if any) and its CSRF value for forms."""
    api = api_of(request)
    grant = request.scope.get(GRANT)
    me = grant if isinstance(grant, Grant) else None
    html = env.get_template(template).render(
        root=_root(request),
        me=me,
        csrf=api.access.csrf(me) if me is not None else "",
        has_memory=api.stores.has_memory,
        **context,
    )
    return HTMLResponse(html, status_code=http_status, headers={**_HEADERS, **(headers or {})})


def error_page(
    request: Request, status: int, error: str, detail: str, headers: Mapping[str, str] | None = None
) -> HTMLResponse:
    """An error, as a page."""
    context = {"status_code": status, "error": error, "detail": detail}
    return render(request, "error.html", status, headers, **context)


async def form(request: Request) -> dict[str, str]:
    """A urlencoded form body (the console's forms), last value of each field."""
    body = (await request.body()).decode("utf-8", "replace")
    return {k: v[-1] for k, v in parse_qs(body, keep_blank_values=True).items()}


def _checked(request: Request, fields: dict[str, str]) -> Grant:
    """The caller, once the form's CSRF field is theirs."""
    grant = caller(request)
    if not api_of(request).access.check_csrf(grant, fields.get("csrf")):
        raise HTTPException(403, "the form is stale or came from another site; reload the page and try again")
    return grant


Form = Depends(form)
#: The console's pages (the guard, the API and the style sheet are the app's).
router = APIRouter()
Served = Annotated[Api, Depends(api_of)]


def _safe_next(target: str | None) -> str:
    """Where to go after the login: a path of this site, never another site."""
    if not target or not target.startswith("/") or target.startswith("//") or "\\" in target:
        return "/"
    return target


# --- login ------------------------------------------------------------------------------


@router.get("/login", include_in_schema=False)
def login_page(request: Request, next: str | None = None) -> HTMLResponse:
    return render(request, "login.html", next=_safe_next(next), failed=False)


@router.post("/login", include_in_schema=False)
def login(request: Request, api: Served, fields: dict[str, str] = Form) -> Response:
    grant = api.access.by_token(fields.get("token", ""))
    target = _safe_next(fields.get("next"))
    if grant is None:
        return render(request, "login.html", 401, next=target, failed=True)
    response = RedirectResponse(_root(request) + target, status_code=303)
    response.set_cookie(
        COOKIE,
        api.access.session(grant),
        max_age=SESSION_SECONDS,
        path=_root(request) or "/",
        secure=True,
        httponly=True,
        samesite="strict",
    )
    return response


@router.post("/logout", include_in_schema=False)
def logout(request: Request, fields: dict[str, str] = Form) -> Response:
    _checked(request, fields)
    response = RedirectResponse(_root(request) + "/login", status_code=303)
    response.delete_cookie(COOKIE, path=_root(request) or "/", secure=True, httponly=True, samesite="strict")
    return response


# --- runs -------------------------------------------------------------------------------


@router.get("/", include_in_schema=False)
@router.get("/runs", include_in_schema=False)
def runs_page(
    request: Request,
    api: Served,
    status: str | None = None,
    workflow: str | None = None,
    owner: str | None = None,
    q: str | None = None,
    offset: int = Query(0, ge=0),
    limit: int = Query(PAGE, ge=1, le=1000),
) -> HTMLResponse:
    grant = caller(request)
    filters = {"status": status or "", "workflow": workflow or "", "owner": owner or "", "q": q or ""}
    page = api.runs(grant, status=status, workflow=workflow, owner=owner, q=q, limit=limit, offset=offset)

    def link(**change: Any) -> str:
        query = {k: v for k, v in {**filters, "limit": limit, **change}.items() if v not in ("", None, 0)}
        if query.get("limit") == PAGE:
            query.pop("limit")
        return f"{_root(request)}/runs" + (f"?{urlencode(query)}" if query else "")

    return render(
        request,
        "runs.html",
        page=page,
        filters=filters,
        statuses=STATUSES,
        link=link,
        counted=sum(page.counts.values()),
    )


@router.get("/runs/{run_id:path}", include_in_schema=False)
def run_page(
    request: Request,
    api: Served,
    run_id: str,
    a: int | None = Query(None, ge=1),
    b: int | None = Query(None, ge=1),
) -> HTMLResponse:
    grant = caller(request)
    run = api.run(grant, run_id)
    states = api.states(grant, run_id)
    if states and (a is None or b is None):
        a, b = max(1, states[-1].version - 1), states[-1].version
    diff = api.state_diff(grant, run_id, a, b) if states and a and b else []
    latest = api.state(grant, run_id, states[-1].version) if states else None
    return render(
        request,
        "run.html",
        run=run,
        timeline=api.timeline(grant, run_id),
        calls=api.model_calls(grant, run_id),
        states=states,
        latest=latest,
        a=a,
        b=b,
        diff=diff,
        live=run.status.value in ("pending", "running"),
    )


# --- approvals ----------------------------------------------------------------------------


@router.get("/approvals", include_in_schema=False)
def approvals_page(
    request: Request, api: Served, status: str = "pending", after: str | None = None
) -> HTMLResponse:
    grant = caller(request)
    found = api.approvals(grant, status=status, limit=APPROVALS_PAGE, after=after)
    following = found[-1].approval_id if len(found) == APPROVALS_PAGE else None
    return render(request, "approvals.html", approvals=found, status=status, after=after, following=following)


@router.get("/approvals/{approval_id}", include_in_schema=False)
def approval_page(request: Request, api: Served, approval_id: str, done: str | None = None) -> HTMLResponse:
    grant = caller(request)
    approval = api.approval(grant, approval_id)
    return render(request, "approval.html", a=approval, done=bool(done) and approval.status != "pending")


@router.post("/approvals/{approval_id}/decide", include_in_schema=False)
def decide_form(request: Request, api: Served, approval_id: str, fields: dict[str, str] = Form) -> Response:
    grant = _checked(request, fields)
    choice = fields.get("decision")
    if choice not in ("approve", "reject"):
        raise InvalidInputError("must be approve or reject", field="decision")
    decision = Decision(approve=choice == "approve", comment=fields.get("comment") or None)
    api.decide(grant, approval_id, decision, via="console")
    return RedirectResponse(f"{_root(request)}/approvals/{approval_id}?done=1", status_code=303)


# --- memory -------------------------------------------------------------------------------


@router.get("/memory", include_in_schema=False)
def memory_page(
    request: Request,
    api: Served,
    owner: str | None = None,
    q: str | None = None,
    k: int = Query(10, ge=1, le=100),
) -> HTMLResponse:
    grant = caller(request)
    found = api.memories(grant, owner, q=q, k=k) if owner else None
    return render(request, "memory.html", owner=owner or "", q=q or "", k=k, found=found)


@router.get("/memory/erase", include_in_schema=False)
def erase_page(request: Request, api: Served, owner: str, memory_id: str | None = None) -> HTMLResponse:
    grant = caller(request)
    found = api.memories(grant, owner)
    doomed = [m for m in found.memories if memory_id is None or m.id == memory_id]
    return render(request, "erase.html", owner=owner, memory_id=memory_id, doomed=doomed, receipt=None)


@router.post("/memory/erase", include_in_schema=False)
def erase(request: Request, api: Served, fields: dict[str, str] = Form) -> HTMLResponse:
    grant = _checked(request, fields)
    owner = fields.get("owner", "")
    receipt = api.erase(
        grant, owner, confirm=fields.get("confirm", ""), memory_id=fields.get("memory_id") or None
    )
    return render(request, "erase.html", owner=owner, memory_id=None, doomed=[], receipt=receipt)


# --- the API's documentation --------------------------------------------------------------


@router.get("/docs", include_in_schema=False)
def docs_page(request: Request) -> HTMLResponse:
    spec = request.app.openapi()
    endpoints = []
    for path, methods in spec.get("paths", {}).items():
        for method, op in methods.items():
            params = [
                {
                    "name": p["name"],
                    "where": p["in"],
                    "required": p.get("required", False),
                    "description": p.get("description") or p.get("schema", {}).get("description", ""),
                }
                for p in op.get("parameters", [])
            ]
            endpoints.append(
                {
                    "method": method.upper(),
                    "path": path,
                    "summary": op.get("summary", ""),
                    "description": op.get("description", ""),
                    "params": params,
                    "body": "requestBody" in op,
                }
            )
    return render(request, "docs.html", spec=spec, endpoints=endpoints)


__all__ = ["CSP", "env", "error_page", "render", "router"]
