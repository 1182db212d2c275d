"""The locks of a LanceDB store: one writer per folder, one operation at a time per store.

LanceDB memory is for one machine and one writer (:class:`FolderLock`); threads
sharing the store take turns (:func:`one_at_a_time`).
"""

from __future__ import annotations

import functools
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Concatenate, ParamSpec, Protocol, TypeVar

from statekeep._extras import requires
from statekeep.db.engine import storage_error
from statekeep.errors import MemoryLockedError, StatekeepError

LOCK_FILE = ".statekeep-writer.lock"


class FolderLock:
    """An exclusive, non-blocking lock on ``<folder>/.statekeep-writer.lock``, held until released.

    ``filelock`` takes it with the operating system's own file lock (``flock``
    on Unix, ``LockFileEx`` on Windows), which the system drops when the process
    dies, so a crash never leaves a stale lock. A second store on the folder, in
    this process or another, gets :class:`~statekeep.errors.MemoryLockedError`.
    """

    def __init__(self, folder: Path) -> None:
        with requires("lancedb", "LanceDB memory"):
            import filelock

        self.path = folder / LOCK_FILE
        # Not thread-local: the store is shared by threads, and close() may run on another one.
        self._lock: filelock.BaseFileLock | None = filelock.FileLock(self.path, timeout=0, thread_local=False)
        try:
            self._lock.acquire()
        except filelock.Timeout as exc:
            self._lock = None
            raise MemoryLockedError(str(folder)) from exc

    def release(self) -> None:
        """Release the lock (idempotent)."""
        if self._lock is not None:
            self._lock.release()
            self._lock = None


class _Store(Protocol):
    _write_lock: Any
    read_only: bool
    path: Path

    def _reopen(self) -> None: ...


S = TypeVar("S", bound=_Store)
P = ParamSpec("P")
R = TypeVar("R")

#: How long a read-only store waits before each new try of a read that met the writer's rewrite.
RETRY_SECONDS = (0.01, 0.05, 0.2, 0.5)

#: What Lance and Arrow raise when a table cannot be read or written: a file gone or damaged, a
#: disk full or failing (OSError; Lance's own errors are RuntimeError, Arrow's ArrowInvalid a
#: ValueError, a missing column or version a KeyError). Errors of statekeep's tree pass as they are.
LANCE_ERRORS = (OSError, RuntimeError, ValueError, KeyError)


@contextmanager
def lance_errors(what: str, folder: Path) -> Iterator[None]:
    """Raise what Lance raises while doing ``what`` as :class:`~statekeep.errors.StorageError`, chained."""
    try:
        yield
    except StatekeepError:
        raise
    except LANCE_ERRORS as exc:
        raise storage_error(exc, f"{what} in the LanceDB memory at {folder}") from exc


def one_at_a_time(
    what: str,
) -> Callable[[Callable[Concatenate[S, P], R]], Callable[Concatenate[S, P], R]]:
    """Run a store's method, which does ``what``, holding its lock (the one a write's look-then-store
    holds, see ``MemoryStore._writing``): erasing and optimizing delete files
    (old versions, and files no version refers to yet), which a write or a read in another thread
    may be using.

    A read-only store reads beside a writer in another process, which no lock
    reaches: a read that started on a version whose files the writer's erasure
    or optimize then replaced fails (a file or row address gone), and is tried
    again on the latest version (``_reopen``).

    What Lance raises, on the last try of a read-only store, is raised as
    :class:`~statekeep.errors.StorageError` saying ``what`` failed (:func:`lance_errors`).
    """

    def decorate(method: Callable[Concatenate[S, P], R]) -> Callable[Concatenate[S, P], R]:
        @functools.wraps(method)
        def locked(self: S, /, *args: P.args, **kwargs: P.kwargs) -> R:
            with self._write_lock, lance_errors(what, self.path):
                if not self.read_only:
                    return method(self, *args, **kwargs)
                for pause in RETRY_SECONDS:
                    try:
                        return method(self, *args, **kwargs)
                    except StatekeepError:  # bad input (a ValueError too) is not retried
                        raise
                    except LANCE_ERRORS:
                        time.sleep(pause)
                        self._reopen()
                return method(self, *args, **kwargs)

        return locked

    return decorate
