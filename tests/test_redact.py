"""Passwords never reach a message: in a URL's user part (SQLAlchemy's own rendering), in its query, or
in a libpq key=value string."""

from __future__ import annotations

import pytest

from statekeep._redact import redact_url


@pytest.mark.parametrize(
    ("value", "shown"),
    [
        ("postgresql://svc:hunter2@db/agents", "postgresql://svc:***@db/agents"),
        (
            "postgresql+psycopg://svc:hunter2@db:5433/a?sslmode=require&password=S3CRET&sslpassword=k3y",
            "postgresql+psycopg://svc:***@db:5433/a?password=***&sslmode=require&sslpassword=***",
        ),
        ("postgresql://svc:p@ss@db/x", "postgresql://svc:***@db/x"),  # an unescaped "@" in the password
        ("postgresql://svc:pw@db:port/x", "postgresql://svc:***@db:port/x"),  # SQLAlchemy cannot parse it
        ("postgresql://svc@db/x", "postgresql://svc@db/x"),
        ("host=db user=svc password=hunter2", "host=db user=svc password=***"),
        ("sqlite:////tmp/a b.db", "sqlite:////tmp/a b.db"),
        ("/var/lib/agent/memory", "/var/lib/agent/memory"),
    ],
)
def test_redact_url(value: str, shown: str) -> None:
    assert redact_url(value) == shown
