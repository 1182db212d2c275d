"""How a call drives a run: sync, on an event loop, or streamed; one sync path under all four.

:func:`drive` is the loop of a call: start (or resume) the run, and while it parked
only to retry a model call soon, sit the wait out and resume it. Every other form
wraps that one function: :func:`adrive` runs it on the caller's event loop
(:mod:`statekeep.db.aio`: statements through the async drivers, async models and
tools awaited on the loop) or, without the async drivers, in a worker thread;
:func:`stream` and :func:`astream` run it with a sink that yields the typed events
as they happen.
"""

from __future__ import annotations

import asyncio
import queue
import threading
from collections.abc import AsyncIterator, Callable, Generator
from datetime import UTC, datetime
from functools import partial
from typing import Any, TypeVar

from statekeep.db import aio
from statekeep.runtime.events import ApprovalRequested, RunCompleted, RunEvent, RunFailed, RunWaiting
from statekeep.runtime.scope import Invocation, invocation
from statekeep.workflow import Engine, Run, RunStatus

T = TypeVar("T")

_DONE = object()


class Driver:
    """Drives runs of one engine; ``retry_wait`` is the longest retry wait a call sits out.

    ``driven`` says whether async calls run on the caller's loop (every database
    of the runtime has an async driver) or in a worker thread.
    """

    def __init__(self, engine: Engine, retry_wait: float, driven: Callable[[], bool]) -> None:
        self.engine, self.retry_wait, self._driven = engine, retry_wait, driven

    # --- the one path ------------------------------------------------------------------------

    def drive(self, inv: Invocation, start: Callable[[], Run]) -> Run:
        """Start the run, then resume it while it parked for a model retry due within ``retry_wait``."""
        token = invocation.set(inv)
        try:
            run = start()
            while (delay := self._wait(run, inv)) is not None:
                aio.pause(delay)
                run = self.engine.resume(run.run_id)
            return run
        finally:
            invocation.reset(token)

    def _wait(self, run: Run, inv: Invocation) -> float | None:
        """Seconds to sit out before resuming a run that parked to retry a model call; None: return it."""
        due, inv.retry_due = inv.retry_due, None
        if due is None or run.status is not RunStatus.SLEEPING:
            return None
        seconds = (due - datetime.now(UTC)).total_seconds()
        return max(0.0, seconds) if seconds <= self.retry_wait else None

    def events(self, inv: Invocation, start: Callable[[], Run]) -> list[RunEvent]:
        """:meth:`drive`, then the closing events of the run."""
        return self.final_events(self.drive(inv, start))

    def final_events(self, run: Run) -> list[RunEvent]:
        """What a stream yields last: completed, failed, or the approvals asked and the run waiting."""
        if run.status is RunStatus.COMPLETED:
            return [RunCompleted(run.run_id, run.output, run)]
        if run.status is RunStatus.FAILED:
            return [RunFailed(run.run_id, run.error, run)]
        asked: list[RunEvent] = []
        if run.status in (RunStatus.WAITING_FOR_APPROVAL, RunStatus.NEEDS_DECISION):
            for a in self.engine.store.approvals(run_id=run.run_id):
                arguments = a.args.get("kwargs", {}) if isinstance(a.args, dict) else {}
                asked.append(ApprovalRequested(run.run_id, a.approval_id, a.action, arguments, a.reason))
        return [*asked, RunWaiting(run.run_id, run.status.value, run)]

    # --- on an event loop ----------------------------------------------------------------------

    async def hop(self, fn: Callable[[], T]) -> T:
        """Run the sync ``fn`` for an async caller: driven on this loop, else in a worker thread."""
        if self._driven():
            return await aio.drive(fn)
        return await asyncio.to_thread(fn)  # the context (the invocation) goes along

    async def adrive(self, inv: Invocation, start: Callable[[], Run]) -> Run:
        """Awaitable :meth:`drive`: async models and tools are awaited on this loop."""
        inv.loop = asyncio.get_running_loop()
        return await self.hop(partial(self.drive, inv, start))

    # --- streams -------------------------------------------------------------------------------

    def stream(self, inv: Invocation, start: Callable[[], Run]) -> Generator[RunEvent, None, None]:
        """:meth:`drive` in a thread, yielding its events here as they happen."""
        events: queue.SimpleQueue[Any] = queue.SimpleQueue()
        inv.sink = events.put
        outcome: list[BaseException] = []

        def work() -> None:
            try:
                for event in self.events(inv, start):
                    events.put(event)
            except BaseException as exc:
                outcome.append(exc)
            finally:
                events.put(_DONE)

        thread = threading.Thread(target=work, name="statekeep-stream", daemon=True)
        thread.start()
        try:
            while (event := events.get()) is not _DONE:
                yield event
        finally:
            thread.join()
        if outcome:
            raise outcome[0]

    async def astream(self, inv: Invocation, start: Callable[[], Run]) -> AsyncIterator[RunEvent]:
        """:meth:`adrive`, yielding its events as they happen."""
        loop = asyncio.get_running_loop()
        events: asyncio.Queue[Any] = asyncio.Queue()

        def sink(event: Any) -> None:
            loop.call_soon_threadsafe(events.put_nowait, event)

        inv.sink = sink
        inv.loop = loop

        async def run() -> None:
            try:
                for event in await self.hop(partial(self.events, inv, start)):
                    events.put_nowait(event)
            finally:
                events.put_nowait(_DONE)

        task = asyncio.ensure_future(run())
        try:
            while (event := await events.get()) is not _DONE:
                yield event
            task.result()
        finally:
            if not task.done():
                await asyncio.wait({task})
