"""Secrets out of messages: a URL's password, in its user part or its query, becomes ``***``.

Used wherever a URL can reach a message, a log or an HTTP answer: errors,
``repr(Database)``, the demo's banner. No statekeep imports, so that the error
tree can use it.
"""

from __future__ import annotations

import re

from sqlalchemy.engine import make_url
from sqlalchemy.exc import ArgumentError

# ?password=..., &sslpassword=..., and the key=value form of libpq connection strings.
_SECRET_PARAM = re.compile(r"(?i)(\b[\w-]*(?:password|secret|token)[\w-]*=)[^&\s]*")


def redact_url(value: str) -> str:
    """``value`` with every password, secret or token in it replaced by ``***``.

    The user part's password is hidden by SQLAlchemy's own rendering
    (``URL.render_as_string(hide_password=True)``, which also sorts the query);
    query parameters and libpq ``key=value`` strings by name.

    >>> redact_url("postgresql://svc:hunter2@db/agents?sslmode=require&password=x")
    'postgresql://svc:***@db/agents?password=***&sslmode=require'
    >>> redact_url("host=db user=svc password=hunter2")
    'host=db user=svc password=***'
    """
    try:
        url = make_url(value)
    except (ArgumentError, ValueError):  # a folder, a libpq key=value string, a URL with a bad port
        return _SECRET_PARAM.sub(r"\1***", _hide_user_password(value))
    if url.password is not None:
        if url.host and "@" in url.host:  # an unescaped "@" in the password: hide up to the last "@"
            url = url.set(host=url.host.rpartition("@")[2])
        value = url.render_as_string(hide_password=True)
    return _SECRET_PARAM.sub(r"\1***", value)


def _hide_user_password(value: str) -> str:
    """The password of ``scheme://user:password@host/...`` as ``***``, for what SQLAlchemy cannot parse."""
    scheme, sep, rest = value.partition("://")
    authority, slash, path = rest.partition("/")
    if not sep or "@" not in authority:
        return value
    creds, host = authority.rsplit("@", 1)
    if ":" in creds:
        creds = creds.split(":", 1)[0] + ":***"
    return f"{scheme}://{creds}@{host}{slash}{path}"
