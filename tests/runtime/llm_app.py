"""A worker process for crash tests: an agent on OpenAIChatModel against a local server, streamed.

``python llm_app.py RUN_ID`` streams the run (``rt.stream``) against the server at
``STATEKEEP_TEST_LLM_URL`` and prints each event kind. ``STATEKEEP_TEST_KILL_AFTER``
names a step after whose function the process kills itself, before the step commits.
"""

from __future__ import annotations

import os
import sys
from typing import Any

from statekeep.config import Settings
from statekeep.memory import FakeEmbedder
from statekeep.models import OpenAIChatModel
from statekeep.runtime import Agent, AgentTool, Runtime
from statekeep.runtime.steps import AgentSteps
from statekeep.workflow import RetryPolicy, RunContext
from tests.runtime.crash_app import dying


def lookup(key: str, city: str) -> dict[str, Any]:
    """Today's weather in a city.

    Args:
        city: the city
    """
    return {"city": city, "weather": "sun"}


AGENT = Agent(
    "streamer",
    system="You plan trips.",
    tools=[AgentTool("lookup", lookup)],
    memory_k=0,
    model_retry=RetryPolicy(attempts=4, backoff=0.05),
)


class CrashingSteps(AgentSteps):
    def think(self, ctx: RunContext, agent: Any, turn: int, attempt: int = 1) -> Any:
        return dying(super().think(ctx, agent, turn, attempt), f"model-{turn}")


def build_runtime(settings: Settings | None = None, url: str | None = None) -> Runtime:
    model = OpenAIChatModel("mimic", base_url=url or os.environ["STATEKEEP_TEST_LLM_URL"], timeout=30)
    rt = Runtime.open(settings, model=model, embedder=FakeEmbedder(), lease=2, retry_wait=60)
    rt.steps = CrashingSteps(rt.context, rt.model, lambda: rt.memory)
    rt.register(AGENT)
    return rt


if __name__ == "__main__":
    runtime = build_runtime(Settings.load())
    try:
        for event in runtime.stream(AGENT, sys.argv[1], owner="ada", task="Oslo or Rome?"):
            print(event.kind, flush=True)
    finally:
        runtime.close()
