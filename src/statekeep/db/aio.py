"""One implementation, two drivers: the sync code path, run on an event loop without blocking it.

statekeep writes each operation once, as plain sync code over SQLAlchemy
connections. An ``async`` entry point (``Runtime.arun``, ``Engine.arun``) runs that
same code in a greenlet (:func:`drive`): every database statement then goes
through an async driver (aiosqlite, psycopg's async connection) and is awaited
on the caller's loop, and so are async models, async tools and waits
(:func:`wait`, :func:`pause`). Called outside :func:`drive`, the same code blocks,
as a sync caller expects. This is SQLAlchemy's own asyncio bridge (its
``AsyncConnection.run_sync``), applied to a whole step instead of one connection.

It needs ``greenlet`` and, for SQLite, ``aiosqlite``: the ``async`` extra. Without
them an async entry point runs the sync path in a worker thread instead
(:func:`available` is False).
"""

from __future__ import annotations

import asyncio
import functools
import importlib
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from typing import Any, TypeVar

T = TypeVar("T")

#: Per loop: how many drives are under way, and what to close when the last one ends.
_depth: dict[asyncio.AbstractEventLoop, int] = {}
_closers: dict[asyncio.AbstractEventLoop, list[Callable[[asyncio.AbstractEventLoop], Awaitable[None]]]] = {}


@functools.cache
def _installed(module: str) -> bool:
    try:
        importlib.import_module(module)
    except ImportError:
        return False
    return True


def available(backend: str = "postgresql") -> bool:
    """True when the async drivers for ``backend`` (``sqlite`` or ``postgresql``) are installed."""
    from statekeep.db.dialects import named

    return _installed("greenlet") and _installed(named(backend).async_module)


def active() -> bool:
    """True inside :func:`drive`: blocking I/O must be awaited on the loop instead."""
    if not _installed("greenlet"):
        return False
    from sqlalchemy.util import concurrency

    return bool(concurrency.in_greenlet())


async def drive(fn: Callable[..., T], *args: Any) -> T:
    """Run the sync ``fn(*args)`` on this loop: its database work and :func:`wait` calls are awaited here."""
    from sqlalchemy.util import greenlet_spawn

    if not _warm:
        await asyncio.to_thread(_warm_up)
    async with session():
        return await greenlet_spawn(fn, *args)


_warm: list[bool] = []


def _warm_up() -> None:
    """Import the async machinery off the loop: the first import takes ~100 ms, which would stall it."""
    modules = ["sqlalchemy.ext.asyncio"]
    if _installed("aiosqlite"):
        modules.append("sqlalchemy.dialects.sqlite.aiosqlite")
    if _installed("psycopg"):
        modules.append("sqlalchemy.dialects.postgresql.psycopg")
    for module in modules:
        importlib.import_module(module)
    _warm.append(True)


@asynccontextmanager
async def session() -> AsyncIterator[None]:
    """Keep this loop's async connections pooled until the outermost session on the loop ends.

    Async connections belong to the loop that opened them, so they are closed
    when the loop's last session ends (an ``arun`` call), not kept for another loop.
    """
    loop = asyncio.get_running_loop()
    _depth[loop] = _depth.get(loop, 0) + 1
    try:
        yield
    finally:
        _depth[loop] -= 1
        if not _depth[loop]:
            del _depth[loop]
            for close in _closers.pop(loop, []):
                await close(loop)


def at_end(
    loop: asyncio.AbstractEventLoop, close: Callable[[asyncio.AbstractEventLoop], Awaitable[None]]
) -> None:
    """Call ``await close(loop)`` when the loop's outermost :func:`session` ends."""
    _closers.setdefault(loop, []).append(close)


def wait(awaitable: Awaitable[T]) -> T:
    """Inside :func:`drive`: await ``awaitable`` on the driving loop and return its result."""
    from sqlalchemy.util import await_only

    return await_only(_coroutine(awaitable))


def pause(seconds: float) -> None:
    """Sleep: on the driving loop inside :func:`drive` (other tasks go on), else the thread."""
    if seconds <= 0:
        return
    if active():
        wait(asyncio.sleep(seconds))
    else:
        time.sleep(seconds)


async def _coroutine(awaitable: Awaitable[T]) -> T:
    return await awaitable
