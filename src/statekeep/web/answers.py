"""How the console answers: JSON with every non-ASCII character escaped, the error body, and
whether a request is a browser's that gets pages instead."""

import json
from collections.abc import Mapping
from typing import Any

from statekeep._extras import requires

with requires("web", "the web console"):
    from fastapi.responses import JSONResponse
    from starlette.datastructures import Headers
    from starlette.types import Scope

TOO_LARGE = "Content Too Large"  # RFC 9110's name; Python's HTTPStatus says "Request Entity Too Large"


class JSONAnswer(JSONResponse):
    """JSON with every non-ASCII character escaped: text no UTF-8 encoder takes (a lone surrogate
    stored before it was refused) is shown escaped, as it is stored, instead of failing the answer."""

    def render(self, content: Any) -> bytes:
        return json.dumps(content, allow_nan=False, separators=(",", ":"), default=str).encode("ascii")


def error_answer(
    status: int, error: str, detail: str, headers: Mapping[str, str] | None = None
) -> JSONAnswer:
    """An error as the API answers it: ``{"error": ..., "detail": ...}``."""
    return JSONAnswer({"error": error, "detail": detail}, status_code=status, headers=dict(headers or {}))


def wants_html(scope: Scope, path: str) -> bool:
    """A browser asking for a page (not the API): it gets pages, redirects and HTML errors."""
    accept = Headers(scope=scope).get("accept", "")
    return "text/html" in accept and not path.startswith("/api/") and path != "/api"


__all__ = ["TOO_LARGE", "JSONAnswer", "error_answer", "wants_html"]
