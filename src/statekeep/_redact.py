"""Secrets out of messages: a URL's password, in its user part or its query, becomes ``***``.

Used wherever a URL can reach a message, a log or an HTTP answer: errors,
``repr(Database)``, the demo's banner. No statekeep imports, so that the error
tree can use it.
"""

from __future__ import annotations

import re

# ?password=..., &sslpassword=..., and the key=value form of libpq connection strings.
_SECRET_PARAM = re.compile(r"(?i)(\b[\w-]*(?:password|secret|token)[\w-]*=)[^&\s]*")


def redact_url(value: str) -> str:
    """``value`` with every password, secret or token in it replaced by ``***``.

    >>> redact_url("postgresql://svc:hunter2@db/agents?sslmode=require&password=x")
    'postgresql://svc:***@db/agents?sslmode=require&password=***'
    """
    value = _SECRET_PARAM.sub(r"\1***", value)
    if "://" not in value or "@" not in value.split("://", 1)[1].split("/", 1)[0]:
        return value
    scheme, rest = value.split("://", 1)
    authority, slash, path = rest.partition("/")
    creds, host = authority.rsplit("@", 1)
    user = creds.split(":", 1)[0]
    if ":" in creds:
        creds = f"{user}:***"
    return f"{scheme}://{creds}@{host}{slash}{path}"
