"""What the in-memory workflow store promises beyond the suite: stored values are JSON, threads are fenced."""

from __future__ import annotations

import threading

from statekeep.errors import LeaseLostError
from statekeep.testing._workflow_kit import mail_registry, refund_registry
from statekeep.workflow import Engine, InMemoryWorkflowStore, Registry, RunContext, RunStatus


def test_records_read_back_are_decoded_copies_never_the_stored_values() -> None:
    """Changing a run, ledger entry or approval that was read changes nothing in the store."""
    store = InMemoryWorkflowStore()
    effects: list[str] = []
    registry = refund_registry(effects, {"value": 5}, registry=mail_registry(effects))
    engine = Engine(store, registry)
    engine.run(registry.get("mail", 1), "m", "ada@example.com")
    engine.run(registry.get("refund", 1), "r", "o-1")
    run, (call,), (ask,) = store.get("m"), store.tool_calls("m"), store.approvals()
    run.input["args"].append("tampered")
    call.result["sent"] = "tampered"
    ask.args["args"].clear()
    assert store.get("m").input == {"args": ["ada@example.com"], "kwargs": {}}
    assert store.tool_call("m", 2) is not None
    assert store.tool_calls("m")[0].result == {"sent": "ada@example.com"}
    assert store.approval(ask.approval_id).args == {"args": ["o-1", 5], "kwargs": {}}


def test_threads_taking_one_run_over_each_other_journal_every_step_once() -> None:
    """Threads resuming one run at once: stale holders are fenced, the journal has each step once."""
    store = InMemoryWorkflowStore()
    registry = Registry()

    @registry.workflow("long", version=1)
    def long(ctx: RunContext) -> int:
        return sum(ctx.step(f"s{i}", int, i) for i in range(40))

    Engine(store, registry).start(long, "r")
    fenced: list[LeaseLostError] = []
    barrier = threading.Barrier(4)

    def worker(name: str) -> None:
        engine = Engine(store, registry, owner=name)
        barrier.wait()
        for _ in range(5):
            try:
                engine.resume("r")
            except LeaseLostError as exc:  # another thread took the run over: expected
                fenced.append(exc)

    threads = [threading.Thread(target=worker, args=(f"w{i}",)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    run = store.get("r")
    assert (run.status, run.output, run.last_seq) == (RunStatus.COMPLETED, sum(range(40)), 40)
    assert [s.name for s in store.steps("r")] == [f"s{i}" for i in range(40)]
    assert all(e.run_id == "r" for e in fenced)
