"""LangGraph threads as runs of the workflow store, so the CLI, the console and the webhook see them.

Each thread is the run ``langgraph:<thread_id>`` of the workflow ``langgraph``, written
through the workflow store's public contract: opened and leased by the saver at the
thread's first checkpoint in a process (``running``), parked as ``waiting_for_event``
while an interrupt waits for a person, taken again when the graph resumes, and
cancelled and deleted with the thread. No worker claims it: no workflow of that name
is registered with a statekeep worker.
"""

from __future__ import annotations

import contextlib
import os
import threading
import uuid

from statekeep.errors import RunFinishedError, RunNotFoundError
from statekeep.workflow import Run, RunStatus, WorkflowStore, codec
from statekeep.workflow.run_write import now

#: The workflow name of thread runs, and the prefix of their run ids.
WORKFLOW = "langgraph"
#: Seconds a saver's lease on a thread's run lasts (it is taken again at the next checkpoint).
LEASE = 24 * 3600.0


def run_id(thread_id: str) -> str:
    """The run id of a LangGraph thread."""
    return f"{WORKFLOW}:{thread_id}"


class ThreadRuns:
    """The run row of each thread this saver writes; one write per thread and process, not per step."""

    def __init__(self, store: WorkflowStore) -> None:
        self.store = store
        self.holder = f"langgraph-saver:{os.getpid()}:{uuid.uuid4().hex[:8]}"
        self._held: dict[str, Run] = {}
        #: threads parked at an interrupt: their checkpoints do not take the run again, a resume does
        self._parked: set[str] = set()
        self._lock = threading.Lock()

    def writing(self, thread_id: str) -> bool:
        """The thread is being written: make sure its run exists and is ``running``; True if taken now."""
        with self._lock:  # LangGraph writes a checkpoint and a task's writes from two threads at once
            if thread_id in self._held or thread_id in self._parked:
                return False
            taken = self._take(thread_id)
            if taken is not None:
                self._held[thread_id] = taken
            return taken is not None

    def interrupted(self, thread_id: str) -> bool:
        """An interrupt waits for a person: park the run until the graph resumes; True if it was taken now."""
        with self._lock:
            held = self._held.pop(thread_id, None)
            run = held or self._take(thread_id)
            self._parked.add(thread_id)
            if run is not None:
                with self.store.fenced(run) as write:
                    write.suspend(RunStatus.WAITING_FOR_EVENT, None, {"langgraph": "interrupt"})
            return held is None and run is not None

    def resumed(self, thread_id: str) -> bool:
        """A person's answer resumes the graph: take the run again; True if it was taken now."""
        with self._lock:
            self._parked.discard(thread_id)
        return self.writing(thread_id)

    def _take(self, thread_id: str) -> Run | None:
        payload = {"args": [thread_id], "kwargs": {}}
        opened = self.store.open_run(
            {
                "run_id": run_id(thread_id),
                "workflow": WORKFLOW,
                "version": 1,
                "input": codec.to_json(payload),
                "input_hash": codec.digest(payload),
                "status": RunStatus.PENDING.value,
                "runnable_at": now(),
            }
        )
        return None if opened.status.finished else self.store.acquire(opened.run_id, self.holder, LEASE)

    def deleted(self, thread_ids: list[str]) -> int:
        """The threads were deleted: cancel and delete their runs; how many runs went."""
        with self._lock:
            for thread_id in thread_ids:
                self._held.pop(thread_id, None)
                self._parked.discard(thread_id)
        doomed = []
        for thread_id in thread_ids:
            found = self.store.find(run_id(thread_id))
            if found is None:
                continue
            if not found.status.finished:
                with contextlib.suppress(RunFinishedError, RunNotFoundError):  # finished or deleted meanwhile
                    self.store.cancel(found.run_id)
            doomed.append(found.run_id)
        return self.store.delete_runs(doomed) if doomed else 0
