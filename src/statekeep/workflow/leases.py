"""Lease heartbeats: one thread per engine extends the leases of every run executing there.

A run's lease is extended every third of its length while the run executes; a
run taken over by another worker is no longer extended (its next write is
refused by the fence anyway). The thread is started by the first run and ends
after a second without runs, so an engine that resumes runs one after another
pays for no thread start per run, and an idle engine holds no thread.
"""

from __future__ import annotations

import itertools
import os
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager

from statekeep.workflow._types import Run

#: Seconds a heartbeat thread waits without runs before it ends.
IDLE_SECONDS = 1.0

#: Extend ``run``'s lease; False once another worker took the run over.
Beat = Callable[[Run], bool]


class Heartbeats:
    """The runs an engine executes, and the thread that extends their leases."""

    def __init__(self, beat: Beat, interval: Callable[[], float]) -> None:
        self._beat, self._interval = beat, interval
        self._reset()

    def _reset(self) -> None:
        self._pid = os.getpid()  # a forked child starts afresh: the parent's thread is not in it
        self._cond = threading.Condition()
        self._due: dict[int, tuple[Run, float]] = {}  # token -> (run, next beat, monotonic seconds)
        self._beating: set[int] = set()
        self._tokens = itertools.count()
        self._thread: threading.Thread | None = None

    @contextmanager
    def held(self, run: Run) -> Iterator[None]:
        """Extend ``run``'s lease while the block executes; no beat of it runs after the block."""
        if self._pid != os.getpid():
            self._reset()
        token = next(self._tokens)
        with self._cond:
            self._due[token] = (run, time.monotonic() + self._interval())
            if self._thread is None:  # a running thread finds the run in time: it waits an interval at most
                self._thread = threading.Thread(target=self._loop, daemon=True, name="statekeep-leases")
                self._thread.start()
        try:
            yield
        finally:
            with self._cond:
                while token in self._beating:  # a beat in flight ends before the run is let go
                    self._cond.wait()
                self._due.pop(token, None)

    def _loop(self) -> None:
        with self._cond:
            while True:
                if not self._due:
                    idle = time.monotonic()
                    while not self._due and time.monotonic() - idle < IDLE_SECONDS:
                        self._cond.wait(min(IDLE_SECONDS, self._interval()))
                    if not self._due:
                        self._thread = None
                        return
                    continue
                token, (run, due) = min(self._due.items(), key=lambda item: item[1][1])
                wait = due - time.monotonic()
                if wait > 0:
                    self._cond.wait(wait)
                    continue
                self._due[token] = (run, time.monotonic() + self._interval())
                self._beating.add(token)
                self._cond.release()
                try:
                    alive = self._safe_beat(run)
                finally:
                    self._cond.acquire()
                    self._beating.discard(token)
                    self._cond.notify_all()
                if not alive:
                    self._due.pop(token, None)

    def _safe_beat(self, run: Run) -> bool:
        try:
            return self._beat(run)
        except Exception:  # a transient database error must not end the heartbeats of every run
            return True
