"""The test agent, with a SIGKILL after a runtime step has logged its events but before it commits.

``STATEKEEP_TEST_KILL_AFTER`` names the step (``begin``, ``model-1``, ``observe-0-0``...).
When the stores share a database, the step's events are written inside its completion's
transaction: the process kills itself there, after the events and the state were
written and before the commit. Otherwise it kills itself right after the step's function
returned, so its context events exist (committed) but its completion record does not.
"""

from __future__ import annotations

import os
import signal
import sys
from typing import Any

from statekeep.config import Settings
from statekeep.runtime.steps import AgentSteps
from statekeep.workflow import Finish, RunContext, RunWrite
from tests.runtime import agent_app


class CrashingSteps(AgentSteps):
    def think(self, ctx: RunContext, agent: Any, turn: int, attempt: int = 1) -> Any:
        return dying(super().think(ctx, agent, turn, attempt), f"model-{turn}")

    def observe(self, ctx: RunContext, call: dict[str, Any], result: Any, step: str) -> Any:
        return dying(super().observe(ctx, call, result, step), step)


def dying(out: Any, step: str) -> Any:
    """``out``, or the process killed at ``step``: inside the completion's transaction when it has one."""
    if not isinstance(out, Finish):
        _maybe_die(step)
        return out

    def finish(tx: RunWrite) -> Any:
        value = out.fn(tx)
        _maybe_die(step)
        return value

    return Finish(finish)


def _maybe_die(step: str) -> None:
    if os.environ.get("STATEKEEP_TEST_KILL_AFTER") == step:
        os.kill(os.getpid(), signal.SIGKILL)


if __name__ == "__main__":
    rt = agent_app.build_runtime(Settings.load())
    rt.steps = CrashingSteps(rt.context, rt.model, lambda: rt.memory)
    try:
        run = rt.run(agent_app.AGENT, sys.argv[1], owner=agent_app.OWNER, task="Plan a trip")
        print(run.status)
    finally:
        rt.close()
