"""Threads sharing one LanceDB store: erasure and optimize run while others write and search.

Erasing and optimizing delete files (old versions, and files no version refers
to yet). A write or a search running beside them in another thread must
neither lose its memory nor read a file that is gone: one store object runs its
operations one at a time. The embedder is the fake one: what is under test is
the table, and the fake lets many more operations meet inside the window.
"""

from __future__ import annotations

import json
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from statekeep.memory import FakeEmbedder
from statekeep.memory.lancedb import LanceDBMemoryStore

pytest.importorskip("lancedb")

ROUNDS = 6


def test_writes_and_searches_survive_erasure_and_optimize_in_other_threads(tmp_path: Path) -> None:
    store = LanceDBMemoryStore(tmp_path / "m", FakeEmbedder())
    for i in range(200):
        store.remember("victim", f"victim fact {i}")
    store.optimize()
    errors: list[tuple[str, BaseException]] = []
    written: list[tuple[str, str, str]] = []
    done = threading.Event()

    def writer(owner: str) -> None:
        i = 0
        while not done.is_set():
            text = f"{owner} remembers zebra number {i}"
            try:
                written.append((owner, store.remember(owner, text).id, text))
            except Exception as exc:  # every failure is reported below, with its thread
                errors.append((f"remember {owner}", exc))
            i += 1

    def reader() -> None:
        while not done.is_set():
            try:
                store.search("w0", "zebra number", k=5)
                store.list_memories("w1")
            except Exception as exc:
                errors.append(("search", exc))

    def upkeep() -> None:
        try:
            for r in range(ROUNDS):
                store.remember_many("victim", [f"victim again {r} {i}" for i in range(30)])
                store.forget("victim")
                store.optimize()
        except Exception as exc:
            errors.append(("upkeep", exc))
        finally:
            done.set()

    threads = [threading.Thread(target=writer, args=(f"w{n}",)) for n in range(2)]
    threads += [threading.Thread(target=reader), threading.Thread(target=upkeep)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=600)
    assert not errors, errors[:3]
    assert len(written) > 10, "the writers barely ran: the test proves nothing"
    for owner in ("w0", "w1"):
        mine = {(mid, text) for o, mid, text in written if o == owner}
        assert {(m.id, m.content) for m in store.list_memories(owner)} == mine
    assert store.list_memories("victim") == []
    store.close()
    again = LanceDBMemoryStore(tmp_path / "m", FakeEmbedder())
    try:  # and a new store object reads the same table
        assert len(again.list_memories("w0")) + len(again.list_memories("w1")) == len(written)
    finally:
        again.close()


READER = """
import json, sys, time
from statekeep.memory import FakeEmbedder
from statekeep.memory.lancedb import LanceDBMemoryStore
store = LanceDBMemoryStore(sys.argv[1], FakeEmbedder(), read_only=True)
reads, errors, stop = 0, [], time.monotonic() + float(sys.argv[2])
while time.monotonic() < stop:
    try:
        found = store.search("w0", "zebra fact", k=5)
        assert len(store.list_memories("w0")) >= 100 and len(found) == 5
        reads += 1
    except Exception as exc:
        errors.append(repr(exc)[:300])
print(json.dumps({"reads": reads, "errors": errors}))
"""


def test_a_read_only_store_in_another_process_reads_through_erasure_and_optimize(tmp_path: Path) -> None:
    """The writer's erasure and optimize replace files under a reader no lock reaches: it reads again."""
    folder = tmp_path / "m"
    store = LanceDBMemoryStore(folder, FakeEmbedder())
    for i in range(100):
        store.remember("w0", f"zebra fact {i}")
    store.optimize()
    seconds = 12.0
    reader = subprocess.Popen(
        [sys.executable, "-c", READER, str(folder), str(seconds)], stdout=subprocess.PIPE, text=True
    )
    rounds = 0
    while reader.poll() is None:
        store.remember_many("victim", [f"victim {rounds} {i}" for i in range(20)])
        store.forget("victim")
        store.remember("w0", f"zebra fact later {rounds}")
        store.optimize()
        rounds += 1
    out, _ = reader.communicate(timeout=60)
    store.close()
    result = json.loads(out)
    assert result["errors"] == []
    assert result["reads"] > 10, "the reader barely ran: the test proves nothing"
    assert rounds > 10, "the writer barely ran: the test proves nothing"
