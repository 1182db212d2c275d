"""Logs: the ``statekeep`` logger hierarchy, with structured fields.

Every logger statekeep uses is under ``statekeep`` (``statekeep.worker``,
``statekeep.workflow``, ``statekeep.web``...). Records carry structured fields
as attributes (:data:`FIELDS`: the run id, the step, the worker...), so any
handler can use them; :func:`configure` installs one that writes them as text
(``key=value`` after the message) or as one JSON object per line.

Nothing is configured on import: a library stays silent until its application
configures logging. ``statekeep worker`` and ``statekeep serve`` call
:func:`configure` with their ``--log-level`` and ``--log-format``.

Examples:
    >>> import io, logging
    >>> out = io.StringIO()
    >>> _ = configure("INFO", "json", stream=out)
    >>> logging.getLogger("statekeep.worker").info("run claimed", extra={"run_id": "r-1", "worker": "w1"})
    >>> sorted(json.loads(out.getvalue()))
    ['level', 'logger', 'message', 'run_id', 'time', 'worker']
    >>> unconfigure()
"""

from __future__ import annotations

import json
import logging
import sys
from datetime import UTC, datetime
from typing import IO, Any, Literal

#: The structured fields a statekeep log record may carry, in the order text logs show them.
FIELDS = (
    "run_id",
    "workflow",
    "step",
    "kind",
    "seq",
    "attempt",
    "status",
    "approval_id",
    "worker",
    "duration_ms",
    "error",
)

LogFormat = Literal["text", "json"]
LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR")

_HANDLER = "statekeep.logs"  # the name of the handler configure() installs (and replaces)


def fields(record: logging.LogRecord) -> dict[str, Any]:
    """The structured fields a record carries (those of :data:`FIELDS` that are set)."""
    return {name: record.__dict__[name] for name in FIELDS if record.__dict__.get(name) is not None}


class JSONFormatter(logging.Formatter):
    """One JSON object per line: ``time``, ``level``, ``logger``, ``message``, then the fields."""

    def format(self, record: logging.LogRecord) -> str:
        out: dict[str, Any] = {
            "time": datetime.fromtimestamp(record.created, UTC).isoformat(timespec="milliseconds"),
            "level": record.levelname.lower(),
            "logger": record.name,
            "message": record.getMessage(),
            **fields(record),
        }
        if record.exc_info:
            out["exception"] = self.formatException(record.exc_info)
        return json.dumps(out, default=str, ensure_ascii=False)


class TextFormatter(logging.Formatter):
    """``time level logger: message key=value ...``, one line per record (values with spaces quoted)."""

    def format(self, record: logging.LogRecord) -> str:
        stamp = datetime.fromtimestamp(record.created, UTC).isoformat(timespec="milliseconds")
        message = _one_line(record.getMessage())
        pairs = " ".join(f"{k}={_value(v)}" for k, v in fields(record).items())
        line = f"{stamp} {record.levelname:<7} {record.name}: {message}" + (f" {pairs}" if pairs else "")
        if record.exc_info:
            line += " " + _one_line(self.formatException(record.exc_info))
        return line


def _value(value: Any) -> str:
    text = str(value)
    if text and all(c.isprintable() and not c.isspace() and c not in "\"'=" for c in text):
        return text
    return json.dumps(text)  # quoted, with newlines and control characters escaped


def _one_line(text: str) -> str:
    """A message on one line: a run id or an error with a newline cannot forge another record."""
    return json.dumps(text)[1:-1] if any(not c.isprintable() for c in text) else text


class _Stderr(logging.StreamHandler):  # type: ignore[type-arg]
    """Writes to whatever ``sys.stderr`` is when a record is emitted (it may have been replaced)."""

    def __init__(self) -> None:
        super().__init__(sys.stderr)

    @property
    def stream(self) -> IO[str]:
        return sys.stderr

    @stream.setter
    def stream(self, value: IO[str]) -> None:
        pass


def configure(
    level: str | int = "INFO", fmt: LogFormat = "text", *, stream: IO[str] | None = None
) -> logging.Handler:
    """Send the ``statekeep`` loggers' records at ``level`` and above to ``stream`` (stderr).

    Calling it again replaces the handler it installed before. Records do not
    also propagate to the root logger, so they are written once.

    Raises:
        ValueError: an unknown level or format.
    """
    if fmt not in ("text", "json"):
        raise ValueError(f"log format must be 'text' or 'json', not {fmt!r}")
    if isinstance(level, str):
        if level.upper() not in LEVELS:
            raise ValueError(f"log level must be one of {', '.join(LEVELS)}, not {level!r}")
        level = level.upper()
    logger = logging.getLogger("statekeep")
    unconfigure()
    handler: logging.StreamHandler[Any] = logging.StreamHandler(stream) if stream else _Stderr()
    handler.set_name(_HANDLER)
    handler.setFormatter(JSONFormatter() if fmt == "json" else TextFormatter())
    logger.addHandler(handler)
    logger.setLevel(level)
    logger.propagate = False
    return handler


def unconfigure() -> None:
    """Remove the handler :func:`configure` installed, and let records propagate again."""
    logger = logging.getLogger("statekeep")
    for handler in list(logger.handlers):
        if handler.get_name() == _HANDLER:
            logger.removeHandler(handler)
            handler.close()
    logger.setLevel(logging.NOTSET)
    logger.propagate = True


__all__ = [
    "FIELDS",
    "LEVELS",
    "JSONFormatter",
    "LogFormat",
    "TextFormatter",
    "configure",
    "fields",
    "unconfigure",
]
