"""The guard before every route: a person's token or login, and a body within the limit.

Every request but ``/health``, the login page and the style sheet needs a
person's token: as ``Authorization: Bearer <token>`` (the API, a chat bot), or
as the cookie the login page sets (a browser). Without one, an API request is a
401 whatever its path, method or body, and a page is a redirect to the login.
The grant found is left in the request's scope for :func:`caller`.
"""

import re

from statekeep._extras import requires
from statekeep.web.access import COOKIE, Access, Grant
from statekeep.web.answers import TOO_LARGE, error_answer, wants_html

with requires("web", "the web console"):
    from fastapi import HTTPException, Request
    from fastapi.responses import PlainTextResponse
    from starlette.datastructures import Headers
    from starlette.exceptions import HTTPException as StarletteHTTPException
    from starlette.types import ASGIApp, Message, Receive, Scope, Send

NEED_TOKEN = "a valid bearer token is required"
CHALLENGE = {"WWW-Authenticate": "Bearer"}
GRANT = "statekeep.grant"  # the ASGI scope key the guard leaves the caller's grant under
#: Paths anyone may reach: the login page and what it needs, and liveness.
_OPEN = re.compile(r"/(health|login|static/[\w.-]+|favicon\.ico)")
#: The approval webhook's paths from before /api: JSON for clients that do not ask for HTML.
_WEBHOOK = re.compile(r"/(approvals(/[^/]+(/decision)?)?|runs/[^/]+)")


class _BodyTooLarge(StarletteHTTPException):
    def __init__(self, limit: int) -> None:
        super().__init__(413, f"the request body is larger than {limit} bytes")


class Guard:
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
            await error_answer(401, "Unauthorized", NEED_TOKEN, CHALLENGE)(scope, receive, send)
            return
        length = headers.get("content-length")
        if length is not None and (not length.isdigit() or int(length) > self.max_body):
            too_large = length.isdigit()
            status, error = (413, TOO_LARGE) if too_large else (400, "Bad Request")
            detail = _BodyTooLarge(self.max_body).detail if too_large else "Content-Length is not a number"
            await error_answer(status, error, detail)(scope, receive, send)
            return
        api = path.startswith("/api/") or (
            _WEBHOOK.fullmatch(path) is not None and not wants_html(scope, path)
        )
        if by_cookie and api and scope["method"] not in ("GET", "HEAD"):
            # the pages change things through their own forms, which carry a CSRF field
            detail = "the API changes nothing for a login cookie: send the bearer token"
            await error_answer(403, "Forbidden", detail)(scope, receive, send)
            return
        scope[GRANT] = grant
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
    grant = request.scope.get(GRANT)
    if not isinstance(grant, Grant):  # the guard lets no request through without one
        raise HTTPException(401, NEED_TOKEN, CHALLENGE)
    return grant


__all__ = ["CHALLENGE", "GRANT", "NEED_TOKEN", "Guard", "caller"]
