"""The test agent, with a SIGKILL after a runtime step has logged its events but before it commits.

``STATEKEEP_TEST_KILL_AFTER`` names the step (``begin``, ``model-1``, ``observe-0-0``...);
the process kills itself right after that step's function returned, so its context
events and staged state exist but its completion record does not.
"""

from __future__ import annotations

import os
import signal
import sys
from typing import Any

from statekeep.config import Settings
from statekeep.runtime.steps import AgentSteps
from statekeep.workflow import RunContext
from tests.runtime import agent_app


class CrashingSteps(AgentSteps):
    def think(self, ctx: RunContext, agent: Any, turn: int, attempt: int = 1) -> dict[str, Any]:
        out = super().think(ctx, agent, turn, attempt)
        _maybe_die(f"model-{turn}")
        return out

    def observe(self, ctx: RunContext, call: dict[str, Any], result: Any, step: str) -> None:
        super().observe(ctx, call, result, step)
        _maybe_die(step)


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
