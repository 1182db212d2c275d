"""Concurrent appends to one session from several processes never produce a duplicate or a gap.

Threads in one process are in the conformance suite.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

import statekeep
from statekeep.context import CharCounter, ContextStore, Message, SQLContextStore

PROCESSES, PER_PROCESS = 3, 20

CHILD = """
import sys, time
from pathlib import Path
from statekeep.context import CharCounter, Message, SQLContextStore
store = SQLContextStore(sys.argv[1], counter=CharCounter())
store.last_seq("warm-up")
Path(sys.argv[4] + "." + sys.argv[2]).touch()
while not Path(sys.argv[4]).exists():
    time.sleep(0.005)
for i in range(int(sys.argv[3])):
    if i % 2:
        store.extend("shared", [Message.user(f"{sys.argv[2]}-{i}a"), Message.user(f"{sys.argv[2]}-{i}b")])
    else:
        store.append("shared", Message.user(f"{sys.argv[2]}-{i}"))
store.db.dispose()
"""


def _assert_gap_free(store: ContextStore, expected: int) -> None:
    seqs = [e.seq for e in store.events("shared")]
    assert seqs == list(range(1, expected + 1))
    assert store.last_seq("shared") == expected


@pytest.mark.slow
def test_processes_appending_to_one_session_get_gap_free_seqs(sql_url: str, tmp_path: Path) -> None:
    """Several OS processes appending (single and batched) at once: no duplicate, no gap."""
    SQLContextStore(sql_url).db.dispose()  # create the schema before the race
    src = str(Path(statekeep.__file__).parents[1])
    env = {**os.environ, "PYTHONPATH": src}
    go = tmp_path / "go"
    procs = [
        subprocess.Popen([sys.executable, "-c", CHILD, sql_url, f"p{p}", str(PER_PROCESS), str(go)], env=env)
        for p in range(PROCESSES)
    ]
    deadline = time.monotonic() + 60
    while len(list(tmp_path.glob("go.p*"))) < PROCESSES and time.monotonic() < deadline:
        time.sleep(0.01)
    go.touch()  # all children start appending at the same moment
    assert [p.wait(timeout=120) for p in procs] == [0] * PROCESSES
    store = SQLContextStore(sql_url, counter=CharCounter())
    per_process = PER_PROCESS + PER_PROCESS // 2  # odd iterations append two messages
    _assert_gap_free(store, PROCESSES * per_process)
    store.db.dispose()


def test_one_read_is_one_snapshot_while_another_writer_commits(sql_url: str) -> None:
    """A build's head, summary and tail reads come from one snapshot (REPEATABLE READ on PostgreSQL).

    Under READ COMMITTED a writer committing between two reads would show the
    builder a head from before the commit and a tail from after it.
    """
    reader = SQLContextStore(sql_url, counter=CharCounter())
    writer = SQLContextStore(sql_url, counter=CharCounter())
    try:
        reader.append("s", Message.user("one"))
        with reader._view() as view:
            head = view.head("s")
            writer.append("s", Message.user("two"))  # commits while the read is open
            tail = view.tail("s", after=0, before=None, limit=10)
        assert head is not None
        assert head.last_seq == 1
        assert [e.seq for e in tail] == [1]
        assert writer.last_seq("s") == 2  # and the write did land
        assert [e.seq for e in reader.events("s")] == [1, 2]
    finally:
        reader.db.dispose()
        writer.db.dispose()
