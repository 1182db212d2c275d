"""A writer lock on a LanceDB folder: LanceDB memory is for one machine and one writer."""

from __future__ import annotations

from pathlib import Path

from statekeep._extras import requires
from statekeep.errors import MemoryLockedError

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
