"""The peers' own test suites, from their source distributions, run against the adapters.

* langgraph-checkpoint 4.3.2: ``tests/test_store.py`` with ``StatekeepStore`` in place of
  ``InMemoryStore`` (LanceDB, then pgvector);
* openai-agents 0.24.0: ``tests/memory/test_session.py`` and ``test_session_limit.py`` with
  ``StatekeepSession`` in place of ``SQLiteSession`` (SQLite, then PostgreSQL).

Each runs in its own pytest process (the suites import their own ``tests`` package),
with the plugin ``peers/statekeep_peers.py``; the sdists are fetched into ``.peers/``
by ``peers/fetch.py`` (``make test`` does it first). Nothing may fail; the counts of
passed and deselected tests are pinned, so a silently skipped test shows up too.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests.integrations.peers.fetch import DEFAULT, fetch

PEERS = Path(__file__).resolve().parent / "peers"

SUITES = {
    "langgraph-store": ("langgraph-checkpoint", ["tests/test_store.py"]),
    "agents-session": (
        "openai-agents",
        ["tests/memory/test_session.py", "tests/memory/test_session_limit.py"],
    ),
}
#: suite -> (passed, deselected): the same on both backends
EXPECTED = {"langgraph-store": (117, 0), "agents-session": (53, 18)}


@pytest.fixture(scope="session")
def peer_sources() -> dict[str, Path]:
    return fetch(Path(os.environ.get("STATEKEEP_PEERS_DIR", DEFAULT)))


@pytest.mark.slow
@pytest.mark.parametrize("backend", ["sqlite", "postgres"])
@pytest.mark.parametrize("suite", sorted(SUITES))
def test_peer_suite(
    suite: str, backend: str, peer_sources: dict[str, Path], request: pytest.FixtureRequest
) -> None:
    package, files = SUITES[suite]
    env = {
        **os.environ,
        "STATEKEEP_PEER_BACKEND": backend,
        "PYTHONPATH": os.pathsep.join(filter(None, [str(PEERS), os.environ.get("PYTHONPATH")])),
    }
    if backend == "postgres":
        env["STATEKEEP_TEST_POSTGRES_URL"] = request.getfixturevalue("postgres_admin_url")
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            *files,
            "-p",
            "statekeep_peers",
            "-p",
            "no:cacheprovider",
            "-q",
            "-o",
            "addopts=",
            "-o",
            "asyncio_default_fixture_loop_scope=function",
            "--timeout=600",
        ],
        cwd=peer_sources[package],
        env=env,
        capture_output=True,
        text=True,
        timeout=1800,
    )
    out = proc.stdout + proc.stderr
    summary = proc.stdout.strip().splitlines()[-1] if proc.stdout.strip() else ""
    print(f"{suite} on {backend}: {summary}")
    counts = {
        word: int(n) for n, word in re.findall(r"(\d+) (passed|failed|deselected|skipped|error)", summary)
    }
    assert proc.returncode == 0, out[-6000:]
    assert (counts.get("passed", 0), counts.get("deselected", 0)) == EXPECTED[suite], summary
