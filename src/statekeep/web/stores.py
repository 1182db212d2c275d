"""The stores the console reads: the workflow store, and optionally working state and memory."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from statekeep.errors import ConfigError, MemoryLockedError

if TYPE_CHECKING:
    from statekeep.config import Settings
    from statekeep.memory import Embedder, MemoryStore
    from statekeep.workflow import WorkflowStore
    from statekeep.working import WorkingStateStore


@dataclass
class Stores:
    """What the console shows: runs and approvals (``workflow``), working-state versions
    (``working``), and memories (``settings`` names the memory store, opened on first use).

    Memory is read through a read-only store (a LanceDB folder is read beside the
    worker that writes it); an erasure opens the store for writing for its duration.
    """

    workflow: WorkflowStore
    working: WorkingStateStore | None = None
    settings: Settings | None = None
    embedder: Embedder | None = None
    _reader: MemoryStore | None = field(default=None, init=False, repr=False)
    _lock: threading.Lock = field(default_factory=threading.Lock, init=False, repr=False)

    @classmethod
    def open(cls, settings: Settings, *, embedder: Embedder | None = None) -> Stores:
        """The stores of existing databases; nothing is created (a missing one names its setting).

        Raises:
            ConfigError: the workflow database is missing, unreachable or not a statekeep database.
        """
        from statekeep._open import find_sql, open_sql
        from statekeep.keys import open_key_ring
        from statekeep.stores import declaration
        from statekeep.workflow import SQLWorkflowStore
        from statekeep.working import SQLWorkingStateStore

        workflow_db = open_sql(settings, "workflow")
        # payloads are sealed with their owner's key; the ring shares the database it is declared in
        keys = open_key_ring(settings, workflow_db if declaration("keys").lives_in == "workflow" else None)
        workflow = SQLWorkflowStore(workflow_db, keys=keys)
        working_db = find_sql(settings, "working")
        working = None if working_db is None else SQLWorkingStateStore(working_db, keys=keys)
        return cls(workflow, working, settings, embedder)

    @property
    def has_memory(self) -> bool:
        """True when a memory store is configured."""
        return self.settings is not None

    def memory(self) -> MemoryStore | None:
        """The memory store for reading, opened on first use; None while it holds no memories yet.

        Raises:
            ConfigError: the memory database cannot be reached.
        """
        if self.settings is None:
            return None
        with self._lock:
            if self._reader is None:
                from statekeep._open import open_memory

                try:
                    self._reader = open_memory(self.settings, self.embedder, read_only=True)
                except ConfigError as exc:
                    if "no memories there" in exc.reason:
                        return None
                    raise
            return self._reader

    @contextmanager
    def memory_writer(self) -> Iterator[MemoryStore]:
        """The memory store for writing (an erasure), for the block's duration.

        Raises:
            MemoryLockedError: a worker holds the LanceDB folder for writing.
        """
        from statekeep._open import open_memory

        reader = self.memory()
        if self.settings is None or reader is None:
            raise ConfigError("STATEKEEP_MEMORY_URL", "", "no memory store holds memories yet")
        if self.settings.memory.backend != "lancedb":
            yield reader  # pgvector: one store reads and writes
            return
        embedder = self.embedder or reader.embedder
        writer = open_memory(self.settings, embedder, read_only=False)
        try:
            yield writer
        finally:
            writer.close()

    def close(self) -> None:
        """Release every store."""
        if self._reader is not None:
            self._reader.close()
        for store in (self.workflow, self.working):
            if store is not None:
                store.close()


__all__ = ["MemoryLockedError", "Stores"]
