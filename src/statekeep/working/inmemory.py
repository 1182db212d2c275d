"""The in-memory reference backend: for unit tests and notebooks, not for durability."""

from __future__ import annotations

import dataclasses
import threading

from statekeep.errors import VersionConflictError
from statekeep.working import base
from statekeep.working._types import StateVersion
from statekeep.working.schema import StateMigrations


class InMemoryWorkingStateStore(base.WorkingStateStore):
    """Working state held in a dict; lost when the process ends."""

    def __init__(self, migrations: StateMigrations | None = None) -> None:
        super().__init__(migrations)
        self._runs: dict[str, list[StateVersion]] = {}
        self._lock = threading.Lock()

    def _append(self, record: StateVersion, expected: int | None) -> StateVersion:
        with self._lock:
            versions = self._runs.setdefault(record.run_id, [])
            latest = versions[-1].version if versions else 0
            if expected is not None and expected != latest:
                raise VersionConflictError(record.run_id, expected, latest)
            stored = dataclasses.replace(record, version=latest + 1)
            versions.append(stored)
            return stored

    def _get(self, run_id: str, version: int | None) -> StateVersion | None:
        versions = self._runs.get(run_id, [])
        if version is None:
            return versions[-1] if versions else None
        return next((v for v in versions if v.version == version), None)

    def _list(self, run_id: str) -> list[StateVersion]:
        return list(self._runs.get(run_id, []))

    def _prune(self, run_id: str, keep: int) -> int:
        with self._lock:
            versions = self._runs.get(run_id, [])
            dropped = max(0, len(versions) - keep)
            self._runs[run_id] = versions[dropped:]
            return dropped

    def _delete(self, run_ids: list[str]) -> int:
        with self._lock:
            return sum(len(self._runs.pop(r, [])) for r in run_ids)
