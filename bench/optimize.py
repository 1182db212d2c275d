"""LanceDB ``optimize`` after new writes on a laid-out table: incremental layout against a full one.

    PYTHONPATH=src python -m bench.optimize            # a table of 20,000 memories
    PYTHONPATH=src python -m bench.optimize --big      # also 100,000

The table is bench.memory's (clustered synthetic 384-d vectors, its owners), loaded
and laid out by one ``optimize``. Each round writes new memories to owners of the
table (each write adds a data file), copies the folder, then times ``optimize()``
on the store (it lays out only what was written since) and ``optimize(full=True)``
on the copy (the whole table rewritten, as every ``optimize`` after a write did
before): the baseline, from the same state, in the same run. Two workloads: 100
writes of one memory, and 20 writes of 100. Medians over ``ROUNDS`` rounds; the
store's rounds follow one another, so they include the merges of small index
segments that a long run of small optimizes makes (their worst round is reported).
"""

from __future__ import annotations

import json
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

from bench.memory import Lookup, load, owner_of, synthetic, timed
from statekeep.memory import MemoryInput

os.environ.setdefault("HF_HUB_OFFLINE", "1")

ROUNDS = 5
#: (name, writes per round, memories per write)
WORKLOADS = (("100 writes of 1", 100, 1), ("20 writes of 100", 20, 100))
RESULTS = Path(__file__).parent / "results" / "optimize.json"


def write(store: Any, first: int, writes: int, size: int) -> int:
    """``writes`` writes of ``size`` new memories (vectors from ``first``) to its owners; the next row."""
    for w in range(writes):
        start = first + w * size
        store.remember_many(owner_of(start), [MemoryInput(f"doc-{i}") for i in range(start, start + size)])
    return first + writes * size


def full_copy(folder: Path, vectors: np.ndarray) -> float:
    """Seconds of ``optimize(full=True)`` on a copy of the folder (the layout before incremental optimize)."""
    from statekeep.memory.lancedb import LanceDBMemoryStore

    with tempfile.TemporaryDirectory() as tmp:
        copy = Path(tmp) / "copy"
        shutil.copytree(folder, copy, ignore=shutil.ignore_patterns("*.lock"))
        with LanceDBMemoryStore(copy, Lookup(vectors), duplicate_threshold=None) as store:
            return timed(lambda: store.optimize(full=True))


def segments(store: Any) -> int:
    return sum(
        len(ix.segments) for ix in store._table.to_lance().describe_indices() if ix.name == "owner_idx"
    )


def bench_rows(rows: int) -> dict[str, Any]:
    from statekeep.memory.lancedb import LanceDBMemoryStore

    extra = sum(ROUNDS * writes * size for _, writes, size in WORKLOADS)
    vectors = synthetic(rows + extra)
    folder = Path(tempfile.mkdtemp(prefix="bench-optimize-"))
    store = LanceDBMemoryStore(folder, Lookup(vectors), duplicate_threshold=None)
    load(store, [owner_of(i) for i in range(rows)])
    out: dict[str, Any] = {"rows": rows, "first_layout_s": timed(store.optimize)}
    row = rows
    for name, writes, size in WORKLOADS:
        incremental, full = [], []
        for _ in range(ROUNDS):
            row = write(store, row, writes, size)
            full.append(full_copy(folder, vectors))
            incremental.append(timed(store.optimize))
        out[name] = {
            "incremental_s": float(np.median(incremental)),
            "incremental_max_s": max(incremental),
            "full_s": float(np.median(full)),
            "ratio": float(np.median(incremental) / np.median(full)),
            "owner_segments_after": segments(store),
        }
        print(f"  {rows} rows, {name}: {out[name]}", flush=True)
    store.close()
    shutil.rmtree(folder, ignore_errors=True)
    return out


def main(argv: list[str]) -> int:
    sizes = [20_000, 100_000] if "--big" in argv else [20_000]
    results: dict[str, Any] = {
        "measured": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        "load_average": [round(x, 1) for x in os.getloadavg()],
        "rounds": ROUNDS,
        "scales": [bench_rows(rows) for rows in sizes],
    }
    for scale in results["scales"]:
        for name, _, _ in WORKLOADS:
            r = scale[name]
            print(
                f"{scale['rows']:>7} rows, {name}: optimize {r['incremental_s'] * 1000:.0f} ms "
                f"(worst {r['incremental_max_s'] * 1000:.0f} ms) vs full layout {r['full_s'] * 1000:.0f} ms "
                f"= {r['ratio']:.3f}x"
            )
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_text(json.dumps(results, indent=2) + "\n")
    print(f"\nwrote {RESULTS}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
