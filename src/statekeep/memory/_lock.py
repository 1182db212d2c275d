"""A writer lock on a LanceDB folder: LanceDB memory is for one machine and one writer."""

from __future__ import annotations

import os
from pathlib import Path
from typing import IO

from statekeep.errors import MemoryLockedError

LOCK_FILE = ".statekeep-writer.lock"


class FolderLock:
    """An exclusive, non-blocking ``flock`` on ``<folder>/.statekeep-writer.lock``, held until released.

    The operating system drops it when the process dies, so a crash never leaves
    a stale lock. (On systems without ``fcntl`` no lock is taken.)
    """

    def __init__(self, folder: Path) -> None:
        self.path = folder / LOCK_FILE
        self._file: IO[str] | None = open(self.path, "a+")  # noqa: SIM115 - held for the store's life
        try:
            import fcntl
        except ImportError:  # pragma: no cover - Windows
            return
        try:
            fcntl.flock(self._file.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as exc:
            self._file.close()
            self._file = None
            raise MemoryLockedError(str(folder)) from exc
        self._file.seek(0)
        self._file.truncate()
        self._file.write(f"{os.getpid()}\n")
        self._file.flush()

    def release(self) -> None:
        """Release the lock (idempotent)."""
        if self._file is not None:
            self._file.close()
            self._file = None
