"""Workers: claim runnable runs under a lease, execute them, poll with backoff when idle."""

from __future__ import annotations

import logging
import threading
import time

from statekeep._check import check_int, check_seconds
from statekeep.errors import InvalidInputError, LeaseLostError, StatekeepError, StorageError
from statekeep.workflow import spans
from statekeep.workflow.engine import Engine

log = logging.getLogger(__name__)


class Worker:
    """A loop that drains runnable runs: pending, due sleeps and waits, and runs whose lease lapsed.

    Start one per process, on as many machines as you like against one PostgreSQL
    (one machine for SQLite). Idle, it costs one short claim query per poll, and the
    poll interval doubles up to ``max_poll``.

    Examples:
        >>> # Worker(Engine(url, registry, lease=30)).run(stop=threading.Event())
    """

    def __init__(self, engine: Engine, *, poll: float = 0.05, max_poll: float = 2.0, batch: int = 1) -> None:
        if not isinstance(engine, Engine):
            raise InvalidInputError(f"must be an Engine, not {type(engine).__name__}", field="engine")
        if check_seconds(poll, "poll", positive=True) > check_seconds(max_poll, "max_poll", positive=True):
            raise InvalidInputError("need 0 < poll <= max_poll", field="poll")
        check_int(batch, "batch", minimum=1, maximum=10_000)
        self.engine, self.poll, self.max_poll, self.batch = engine, poll, max_poll, batch

    def run_once(self) -> int:
        """Claim up to ``batch`` runnable runs and execute them; return how many were claimed."""
        claimed = self.engine.store.claim(
            self.engine.owner, self.engine.lease, self.batch, self.engine.registry.runnable()
        )
        for run in claimed:
            spans.run_claimed(run, self.engine.owner)
            try:
                self.engine.execute(run)
            except LeaseLostError as exc:
                spans.lease_lost(run, self.engine.owner, exc)
            except StorageError as exc:  # the lease lapses and another worker retries the run
                log.warning("run %s interrupted by a database error: %s", run.run_id, exc)
            except StatekeepError as exc:
                log.error("run %s stopped: %s", run.run_id, exc)
        return len(claimed)

    def run(self, *, stop: threading.Event | None = None, idle_exit: float | None = None) -> int:
        """Loop until ``stop`` is set (or after ``idle_exit`` seconds without work); return runs handled.

        Raises:
            InvalidInputError: ``idle_exit`` is not a number of seconds >= 0.
        """
        if idle_exit is not None:
            idle_exit = check_seconds(idle_exit, "idle_exit")
        stop = stop or threading.Event()
        handled, delay, idle_since = 0, self.poll, time.monotonic()
        while not stop.is_set():
            try:
                n = self.run_once()
            except StorageError as exc:  # the database blinked: back off and try again
                log.warning("claim failed: %s", exc)
                n = 0
            handled += n
            if n:
                delay, idle_since = self.poll, time.monotonic()
                continue
            if idle_exit is not None and time.monotonic() - idle_since >= idle_exit:
                break
            stop.wait(delay)
            delay = min(self.max_poll, delay * 2)
        return handled
