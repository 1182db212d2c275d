"""Run (or resume) one turn of a test agent run in this process, then exit: ``step_once.py RUN_ID``."""

from __future__ import annotations

import sys

from statekeep.config import Settings
from tests.runtime import agent_app

run_id = sys.argv[1]
runtime = agent_app.build_runtime(Settings.load())
try:
    if runtime.engine.store.find(run_id) is None:
        run = runtime.run(agent_app.AGENT, run_id, owner=agent_app.OWNER, task="Plan a trip", turns=1)
    else:
        run = runtime.resume(run_id, turns=1)
    print(run.status)
finally:
    runtime.close()
