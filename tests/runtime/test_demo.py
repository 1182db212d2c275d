"""The demo, end to end, as `make demo` runs it: on the embedded default and on PostgreSQL."""

from __future__ import annotations

import os
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest

from statekeep.keys import KeyRing, LocalKeyFile
from statekeep.workflow import RunStatus, SQLWorkflowStore
from tests.runtime.conftest import ROOT


@pytest.mark.slow
@pytest.mark.timeout(900)  # the whole demo, with real crashes: over 2 minutes on a busy 2-core machine
@pytest.mark.parametrize("backend", ["sqlite", "postgres"])
def test_demo_crashes_resumes_waits_and_writes_the_crm_once(
    backend: str, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    """A worker is SIGKILLed mid-run, another resumes, a manager approves, the CRM is written once."""
    args = [sys.executable, "-m", "statekeep", "demo", "--home", str(tmp_path / "home")]
    if backend == "postgres":
        url = request.getfixturevalue("postgres_url")
        args += ["--database-url", url]
    env = {
        **os.environ,
        "PYTHONPATH": str(ROOT / "src"),
        "COLUMNS": "200",
    }
    env.pop("STATEKEEP_DATABASE_URL", None)
    env.pop("STATEKEEP_MEMORY_URL", None)
    out = subprocess.run(args, env=env, capture_output=True, text=True, timeout=600, cwd=tmp_path)
    text = out.stdout + out.stderr
    assert out.returncode == 0, text
    assert "SIGKILL worker 1" in text
    assert "reconciler: research call" in text
    assert "waiting_for_approval" in text
    assert "approved by manager@acme.example" in text
    assert "CRM writes performed: 1" in text
    assert "search after erasure: 0 results" in text
    assert "Traceback" not in text
    # check what the demo claims, independently of its narration
    demo_home = tmp_path / "home" / "demo"
    with sqlite3.connect(demo_home / "crm.sqlite") as crm:
        assert crm.execute("SELECT count(*) FROM write_log").fetchone()[0] == 1
    workflow_url = url if backend == "postgres" else f"sqlite:///{demo_home / 'statekeep.db'}"
    keys = KeyRing(workflow_url, LocalKeyFile(demo_home / "keys.json"))  # payloads are sealed at rest
    store = SQLWorkflowStore(workflow_url, keys=keys)
    [run] = store.list_runs()
    assert run.status is RunStatus.COMPLETED
    [approval] = store.approvals(status=None)
    assert (approval.status, approval.decided_by) == ("approved", "manager@acme.example")
    # the killed worker's call was settled by the reconciler: every ledger call completed
    assert {c.status for c in store.tool_calls(run.run_id)} == {"completed"}
    store.db.dispose()
    keys.db.dispose()
