"""Issue 12, part 1: a stale worker can never take a child run.

Real processes on one database, with a 1 s lease. Worker A takes a parent run and
SIGSTOPs itself at a point around ``ctx.child``; the test waits past A's lease; worker B
takes the run over and drives it as far as it can; then A gets SIGCONT. Whatever A does
then, it no longer holds the parent: the database must refuse its writes, it must not take
the child, and the child's tool, whose API does **not** deduplicate on the idempotency key
(no reconciler), must have run exactly once. A fresh worker C (and, where a call was
genuinely in flight, a person) finishes what is left; the run always completes.

The last test has no pause: a parent resumed inline must leave another worker's live claim
on its orphaned child alone, and wait for the child.
"""

from __future__ import annotations

import contextlib
import functools
import os
import random
import signal
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pytest

from statekeep.db import Database
from statekeep.workflow import Engine, RunStatus

from . import fencing_workload as fencing
from .conftest import crash_scale, fork, wait, wait_stopped

pytestmark = [pytest.mark.crash, pytest.mark.slow]

LEASE = fencing.LEASE
PARENT, CHILD = fencing.PARENT, fencing.CHILD


@dataclass(frozen=True)
class Pause:
    """Where A stops itself, how the test drives B, and the outcome once the engine is right."""

    name: str
    a_stop: str
    #: where B stops itself too (a live call of B's that A must not disturb)
    b_stop: str | None = None
    #: whether the child waits for a "go" event and when the test sends it: "none" (no wait),
    #: "early" (the child exists when A stops), "during-b" (once B's child waits for it) or
    #: "after-b" (once B is done, before SIGCONT A)
    go: str = "none"
    #: A stopped inside the tool call: nobody can know whether it happened, so a person decides
    ambiguous: bool = False
    #: who makes the one real call
    effect_by: str = "B"


PAUSES = [
    # A: parent step p0 committed, then frozen; the child does not exist yet. B takes the parent,
    # starts the child, which waits for "go"; the test sends it. A wakes: it must not take the
    # child (it does not hold the parent), so it makes no call; C runs the child and the parent.
    Pause("before-child", "before_child", go="after-b", effect_by="C"),
    # The same, but B is inside the child's tool when A wakes: A must not take the child from
    # under B's live lease (B would be the one fenced out, the call ambiguous). B finishes.
    Pause("before-child-during-b-call", "before_child", b_stop="tool:before", go="during-b"),
    # A froze inside the child's first step (the child exists, A held it). B takes both over
    # and finishes; A's completion of k0 is refused.
    Pause("in-child-step", "in:k0", go="early"),
    # A froze inside the call, before its effect: the ledger says "started", so B cannot know
    # and asks a person (needs_decision). A wakes and makes the call (it was in flight: no
    # database can stop that), its completion is refused; the person sees the effect and
    # decides "it happened"; C completes the run with the person's result.
    Pause("in-tool-before-effect", "tool:before", ambiguous=True, effect_by="A"),
    # A froze inside the call, after its effect: as above; the call was made once, by A.
    Pause("in-tool-after-effect", "tool:after", ambiguous=True, effect_by="A"),
]


class Procs:
    """The processes of one test; whatever is left is killed at the end."""

    def __init__(self, db: Database) -> None:
        self.db, self.pids = db, list[int]()

    def fork(self, target: Callable[[], None]) -> int:
        self.db.dispose()  # nothing pooled across fork
        pid = fork(target)
        self.pids.append(pid)
        return pid

    def cleanup(self) -> None:
        for pid in self.pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
            with contextlib.suppress(ChildProcessError):
                os.waitpid(pid, 0)


def wait_for(check: Callable[[], bool], what: str, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.02)


def status(console: Engine, run_id: str) -> RunStatus | None:
    run = console.store.find(run_id)
    return None if run is None else run.status


def completed(console: Engine, run_id: str) -> bool:
    return status(console, run_id) is RunStatus.COMPLETED


def snapshot(console: Engine) -> dict[tuple[str, int], str]:
    """The journal entries (parent and child) as they are now."""
    return {(s.run_id, s.seq): s.output for r in (PARENT, CHILD) for s in console.store.steps(r)}


def settle(console: Engine, url: str, work: Path, procs: Procs) -> None:
    """What operators do: answer the person's question from the provider's records; worker C finishes."""
    for _ in range(3):
        if status(console, PARENT) is RunStatus.COMPLETED:
            return
        if status(console, CHILD) is RunStatus.WAITING_FOR_EVENT:
            console.store.send_event(CHILD, "go", "go!")
        for ask in console.store.approvals(kind="ambiguous", status="pending"):
            (call,) = console.store.tool_calls(CHILD)
            happened = any(x.kind == "effect" and x.what == call.key for x in fencing.actions(work))
            result = {"sent": call.key} if happened else None
            console.store.decide(ask.approval_id, approve=not happened, by="ops@example.com", result=result)
        c = procs.fork(lambda: fencing.worker("C", url, work, {}, idle_exit=LEASE + 0.5))
        assert wait(c) == 0


@pytest.mark.parametrize("pause", PAUSES, ids=lambda p: p.name)
def test_a_stale_worker_is_refused_at_every_point_around_a_child(
    pause: Pause, database_url: str, tmp_path: Path
) -> None:
    """A frozen past its lease, B takes over, A wakes: A's writes refused, one real call per key."""
    url, work = database_url, tmp_path
    db = Database(url)
    console = Engine(db, fencing.build(), owner="console", lease=LEASE)
    procs = Procs(db)
    try:
        console.start(console.registry.get("parent", 1), PARENT, pause.go != "none")
        a = procs.fork(lambda: fencing.worker("A", url, work, {pause.a_stop: "stop"}, once=True))
        wait_stopped(a)
        before = snapshot(console)
        if pause.go == "early":
            console.store.send_event(CHILD, "go", "go!")
        time.sleep(LEASE + 0.3)  # A's leases lapse: its heartbeats are frozen with it

        b_plan = {pause.b_stop: "stop"} if pause.b_stop else {}
        b = procs.fork(lambda: fencing.worker("B", url, work, b_plan, idle_exit=3.0 if pause.b_stop else 0.5))
        if pause.go == "during-b":
            wait_for(lambda: status(console, CHILD) is RunStatus.WAITING_FOR_EVENT, "B's child to wait")
            console.store.send_event(CHILD, "go", "go!")
        if pause.b_stop:
            wait_stopped(b)
        else:
            assert wait(b) == 0
        if pause.go == "after-b":
            assert status(console, CHILD) is RunStatus.WAITING_FOR_EVENT
            console.store.send_event(CHILD, "go", "go!")

        os.kill(a, signal.SIGCONT)
        assert wait(a) == 0
        if pause.b_stop:
            os.kill(b, signal.SIGCONT)
            assert wait(b) == 0
        settle(console, url, work, procs)
        check(console, work, pause, before)
    finally:
        procs.cleanup()
        db.dispose()


def check(console: Engine, work: Path, pause: Pause, before: dict[tuple[str, int], str]) -> None:
    parent, kid = console.store.get(PARENT), console.store.get(CHILD)
    assert parent.status is RunStatus.COMPLETED, (parent.status, parent.error, parent.waiting)
    assert kid.status is RunStatus.COMPLETED, (kid.status, kid.error, kid.waiting)
    (call,) = console.store.tool_calls(CHILD)
    done = fencing.actions(work)
    # the provider saw the call exactly once, made by the expected worker
    assert [(x.actor, x.what) for x in done if x.kind == "effect"] == [(pause.effect_by, call.key)], done
    # A did nothing after it woke up, except finish a call it was in the middle of
    stop = next(i for i, x in enumerate(done) if (x.actor, x.kind) == ("A", "stop"))
    late = [(x.kind, x.what) for x in done[stop + 1 :] if x.actor == "A"]
    assert late == ([("effect", call.key)] if pause.a_stop == "tool:before" else []), done
    # the journal keeps what was committed before A stopped, and nothing A did after
    for run_id in (PARENT, CHILD):
        for step in console.store.steps(run_id):
            if (run_id, step.seq) in before:
                assert step.output == before[(run_id, step.seq)], step
            elif step.kind == "step":
                assert not step.value.startswith("A:"), f"a step of the stale worker was recorded: {step}"
    # A heard that its writes were refused; the live workers never were
    assert fencing.refused(work / "A.log"), (work / "A.log").read_text()
    for actor in ("B", "C"):
        log = work / f"{actor}.log"
        assert not fencing.refused(log), log.read_text()
    asks = [(a.status, a.result) for a in console.store.approvals(kind="ambiguous", status=None)]
    assert asks == ([("rejected", {"sent": call.key})] if pause.ambiguous else []), asks
    k0 = console.store.steps(CHILD)[0].value
    go = None if pause.go == "none" else "go!"
    assert parent.output == kid.output == [k0, go, call.key]


def test_resuming_a_parent_inline_leaves_a_live_claim_on_its_child_alone(
    database_url: str, tmp_path: Path
) -> None:
    """An orphaned child claimed by W; its parent resumed inline by R: R waits, W finishes, unfenced."""
    url, work = database_url, tmp_path
    db = Database(url)
    console = Engine(db, fencing.build(), owner="console", lease=LEASE)
    procs = Procs(db)
    try:
        console.start(console.registry.get("parent", 1), PARENT, True)
        a = procs.fork(lambda: fencing.worker("A", url, work, {"in:k0": "kill"}, once=True))
        assert wait(a) == -signal.SIGKILL  # the parent and its child are orphans
        console.store.send_event(CHILD, "go", "go!")
        time.sleep(LEASE + 0.3)
        # W runs only children: it claims the orphaned child and is busy in its first step
        w = procs.fork(
            lambda: fencing.worker("W", url, work, {"in:k0": "block"}, idle_exit=1.0, parent=False)
        )
        wait_for(lambda: any((x.actor, x.kind) == ("W", "block") for x in fencing.actions(work)), "W")
        claimed = console.store.get(CHILD)
        assert (claimed.status, claimed.lease_owner) == (RunStatus.RUNNING, "W")

        assert wait(procs.fork(lambda: fencing.resume("R", url, work, PARENT))) == 0
        parent, kid = console.store.get(PARENT), console.store.get(CHILD)
        assert parent.status is RunStatus.WAITING_FOR_CHILD, (parent.status, parent.error)
        assert (kid.status, kid.epoch, kid.lease_owner) == (RunStatus.RUNNING, claimed.epoch, "W")

        (work / "release").touch()
        assert wait(w) == 0
        assert not fencing.refused(work / "W.log"), (work / "W.log").read_text()
        kid = console.store.get(CHILD)
        assert kid.status is RunStatus.COMPLETED, (kid.status, kid.error)
        (call,) = console.store.tool_calls(CHILD)
        done = fencing.actions(work)
        assert [(x.actor, x.what) for x in done if x.kind == "effect"] == [("W", call.key)], done
        k0 = console.store.steps(CHILD)[0].value
        assert k0.startswith("W:"), k0

        assert wait(procs.fork(lambda: fencing.resume("R", url, work, PARENT))) == 0
        parent = console.store.get(PARENT)
        assert parent.status is RunStatus.COMPLETED, (parent.status, parent.error)
        assert parent.output == [k0, "go!", call.key]
    finally:
        (work / "release").touch()
        procs.cleanup()
        db.dispose()


def test_a_parent_that_waits_for_a_child_another_worker_is_finishing_is_always_woken(
    database_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Races a parent's inline resume against another worker finishing its child: no lost wakeup.

    Each parent waits for its child, whose "go" is sent; worker W (children only) claims the
    child and finishes it while the test resumes the parent inline, after a random delay.
    Whoever takes the child, the parent must complete, or be woken (pending) once the child
    has finished; never left ``waiting_for_child`` for a finished child.
    """
    url, work = database_url, tmp_path
    monkeypatch.setattr(fencing, "ME", fencing.Actor("R", work=work))  # this process resumes inline
    db = Database(url)
    console = Engine(db, fencing.build(), owner="R", lease=LEASE)
    parent = console.registry.get("parent", 1)
    procs = Procs(db)
    rng = random.Random(5)
    rounds = 40 * crash_scale()
    try:
        w = procs.fork(lambda: fencing.worker("W", url, work, {}, idle_exit=30.0, parent=False, poll=0.002))
        for i in range(rounds):
            run_id = f"race-{i}"
            assert console.run(parent, run_id, True).status is RunStatus.WAITING_FOR_CHILD
            console.store.send_event(fencing.child_of(run_id), "go", "go!")
            time.sleep(rng.uniform(0.0, 0.03))
            console.resume(run_id)
            kid_done = functools.partial(completed, console, fencing.child_of(run_id))
            wait_for(kid_done, "W to finish the child")
            time.sleep(0.01)
            got = status(console, run_id)
            assert got in (RunStatus.PENDING, RunStatus.COMPLETED), f"{run_id} is {got}; its child finished"
        os.kill(w, signal.SIGKILL)
        for i in range(rounds):
            assert console.resume(f"race-{i}").status is RunStatus.COMPLETED
    finally:
        procs.cleanup()
        db.dispose()
