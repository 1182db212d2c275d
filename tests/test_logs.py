"""The statekeep logger hierarchy: a line per run claimed, step completed, wait, retry, failure and
lease lost, with the run id, step and worker as fields, as text or JSON."""

from __future__ import annotations

import io
import json
import logging
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from statekeep import logs
from statekeep.errors import LeaseLostError
from statekeep.workflow import Engine, Registry, RetryPolicy, RunContext, Step, Worker


@pytest.fixture
def json_log() -> Iterator[io.StringIO]:
    out = io.StringIO()
    logs.configure("INFO", "json", stream=out)
    yield out
    logs.unconfigure()


def records(out: io.StringIO) -> list[dict[str, Any]]:
    return [json.loads(line) for line in out.getvalue().splitlines()]


def test_a_worker_logs_each_run_claimed_step_completed_retry_wait_and_failure(
    tmp_path: Path, json_log: io.StringIO
) -> None:
    registry = Registry()
    flaky = {"left": 1}

    def once_broken() -> str:
        if flaky["left"]:
            flaky["left"] -= 1
            raise RuntimeError("the service blinked")
        return "ok"

    @registry.tool("refund")
    def refund(key: str, amount: int) -> int:
        return amount

    @registry.workflow("refund", version=1)
    def refund_flow(ctx: RunContext, amount: int) -> Any:
        ctx.step(Step("check", retry=RetryPolicy(attempts=2)), once_broken)
        return ctx.call_tool(refund.requiring_approval("refunds need a person"), amount)

    @registry.workflow("doomed", version=1)
    def doomed(ctx: RunContext) -> None:
        raise ValueError("no such order")

    engine = Engine(f"sqlite:///{tmp_path / 'x.db'}", registry, owner="worker-7")
    engine.start(refund_flow, "refund-1", 120)
    engine.start(doomed, "doomed-1")
    assert Worker(engine, batch=2).run_once() == 2
    lines = records(json_log)
    assert {"message", "level", "logger", "time"} <= set(lines[0])
    said = [(r["message"], r.get("step")) for r in lines if r.get("run_id") == "refund-1"]
    assert said == [
        ("run claimed", None),
        ("step attempt failed; retrying", "check"),
        ("step completed", "check"),
        ("run waits", None),
    ]
    assert [r["message"] for r in lines if r.get("run_id") == "doomed-1"] == ["run claimed", "run failed"]
    refund_lines = [r for r in lines if r.get("run_id") == "refund-1"]
    failed = next(r for r in lines if r["message"] == "run failed")
    waits = refund_lines[3]
    assert (waits["status"], waits["worker"], waits["logger"]) == (
        "waiting_for_approval",
        "worker-7",
        "statekeep.worker",
    )
    assert waits["approval_id"] == engine.store.approvals(run_id="refund-1")[0].approval_id
    completed = refund_lines[2]
    assert (completed["seq"], completed["attempt"], completed["kind"]) == (1, 2, "step")
    assert (failed["error"], failed["level"]) == ("ValueError: no such order", "warning")
    engine.store.close()


def test_a_worker_whose_run_was_taken_over_logs_the_lease_lost(tmp_path: Path, json_log: io.StringIO) -> None:
    url = f"sqlite:///{tmp_path / 'x.db'}"
    registry = Registry()
    thief = Engine(url, Registry(), owner="worker-2")

    def stolen() -> str:
        thief.store.acquire("slow-1", "worker-2", 30)  # another worker takes the run over meanwhile
        return "done"

    @registry.workflow("slow", version=1)
    def slow(ctx: RunContext) -> str:
        return str(ctx.step("work", stolen))

    engine = Engine(url, registry, owner="worker-1")
    engine.start(slow, "slow-1")
    Worker(engine).run_once()
    lost = [r for r in records(json_log) if r["message"] == "lease lost"]
    assert len(lost) == 1
    assert (lost[0]["run_id"], lost[0]["worker"]) == ("slow-1", "worker-1")
    assert LeaseLostError.__name__ in lost[0]["error"] or "slow-1" in lost[0]["error"]
    engine.store.close()
    thief.store.close()


def test_text_lines_carry_the_fields_and_cannot_be_forged_by_a_run_id() -> None:
    out = io.StringIO()
    logs.configure("DEBUG", "text", stream=out)
    try:
        log = logging.getLogger("statekeep.worker")
        log.info("run claimed", extra={"run_id": "r-1\nfake line", "worker": "w 1", "seq": 3})
        log.debug("detail")
    finally:
        logs.unconfigure()
    first, second = out.getvalue().splitlines()
    assert first.endswith('INFO    statekeep.worker: run claimed run_id="r-1\\nfake line" seq=3 worker="w 1"')
    assert second.endswith("DEBUG   statekeep.worker: detail")


def test_configure_refuses_an_unknown_level_or_format_and_replaces_itself() -> None:
    with pytest.raises(ValueError, match="level"):
        logs.configure("LOUD")
    with pytest.raises(ValueError, match="format"):
        logs.configure("INFO", "xml")  # type: ignore[arg-type]
    first, second = io.StringIO(), io.StringIO()
    logs.configure("INFO", stream=first)
    logs.configure("INFO", stream=second)
    logging.getLogger("statekeep.web").warning("once")
    logs.unconfigure()
    assert (first.getvalue(), second.getvalue().count("once")) == ("", 1)
    assert logging.getLogger("statekeep").propagate
