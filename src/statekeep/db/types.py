"""Column types shared by the SQL stores."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import sqlalchemy as sa

from statekeep.db.dialects import hooks


class UTCDateTime(sa.TypeDecorator[datetime]):
    """A timestamp that is always timezone-aware UTC in Python, on every backend.

    SQLite has no timezone type, so values are stored as naive UTC there and
    tagged UTC again on the way out.
    """

    impl = sa.DateTime(timezone=True)
    cache_ok = True

    def process_bind_param(self, value: datetime | None, dialect: Any) -> datetime | None:
        if value is None:
            return None
        if value.tzinfo is None:
            raise ValueError("naive datetime; statekeep stores only timezone-aware times")
        value = value.astimezone(UTC)
        return value if hooks(dialect).keeps_time_zones else value.replace(tzinfo=None)

    def process_result_value(self, value: datetime | None, dialect: Any) -> datetime | None:
        if value is None:
            return None
        return value.replace(tzinfo=UTC) if value.tzinfo is None else value.astimezone(UTC)
