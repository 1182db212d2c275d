"""The LanceDB writer lock across processes: a second writer fails clearly; a dead one leaves no lock."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from statekeep.memory import FakeEmbedder
from statekeep.memory.lancedb import LanceDBMemoryStore

OPEN = """
import sys
from statekeep.errors import MemoryLockedError
from statekeep.memory import FakeEmbedder
from statekeep.memory.lancedb import LanceDBMemoryStore
try:
    store = LanceDBMemoryStore(sys.argv[1], FakeEmbedder())
except MemoryLockedError as exc:
    print("locked:", exc.setting)
else:
    print("opened", flush=True)
    if sys.argv[2:] == ["hold"]:
        sys.stdin.read()  # hold the lock until killed
    store.close()
"""


def _open_in_another_process(folder: Path) -> str:
    done = subprocess.run(
        [sys.executable, "-c", OPEN, str(folder)], capture_output=True, text=True, timeout=120, check=True
    )
    return done.stdout.strip()


def test_a_second_writer_process_gets_memory_locked_error(tmp_path: Path) -> None:
    """While this process holds the folder, another process's store is refused; after close it opens."""
    store = LanceDBMemoryStore(tmp_path / "m", FakeEmbedder())
    assert _open_in_another_process(tmp_path / "m") == "locked: STATEKEEP_MEMORY_URL"
    store.close()
    assert _open_in_another_process(tmp_path / "m") == "opened"


def test_a_killed_writer_leaves_no_lock(tmp_path: Path) -> None:
    """The operating system drops the lock of a process that dies, so a crash never blocks the folder."""
    holder = subprocess.Popen(
        [sys.executable, "-c", OPEN, str(tmp_path / "m"), "hold"],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert holder.stdout is not None
        assert holder.stdout.readline().strip() == "opened"
        assert _open_in_another_process(tmp_path / "m") == "locked: STATEKEEP_MEMORY_URL"
    finally:
        holder.kill()
        holder.wait(timeout=60)
        if holder.stdin is not None:
            holder.stdin.close()
        if holder.stdout is not None:
            holder.stdout.close()
    with LanceDBMemoryStore(tmp_path / "m", FakeEmbedder()) as store:
        assert store.list_memories("anyone") == []
