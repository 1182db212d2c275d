"""Retrieval quality on public long conversations, per search mode, on LanceDB and pgvector.

    PYTHONPATH=src python -m bench.retrieval             # full: LoCoMo and LongMemEval, both backends
    PYTHONPATH=src python -m bench.retrieval --small     # one held-out LoCoMo conversation (make test)
    PYTHONPATH=src python -m bench.retrieval --json out.json --datasets locomo --backends lancedb

Each turn of a conversation is remembered for the conversation's owner (content
"Speaker: text", the session as ``provenance.session_id``, speaker and turn id in
``metadata``, the session's date as the store's clock), with the store's defaults
(``dedupe="exact"``: a turn repeating an earlier one stands for it). Each question is
searched within its owner (k=20); recall@k is the share of the question's evidence
turns among the first k results, averaged over questions. Modes: the store's
``vector`` (plain dense: the baseline), ``text`` (plain full-text: BM25 on LanceDB,
length-normalised ``ts_rank`` of the query's distinctive words, weighted by inverse document
frequency, on PostgreSQL),
``hybrid`` (the default), and ``rrf``, the hybrid search of statekeep before this
benchmark (reciprocal-rank fusion of ``max(4k, 20)`` of each), measured from the
same primitives. Owners are split once into a development part, on which methods
and constants were chosen, and a held-out part, on which they are
reported (bench/_datasets.py says how and where the data come from).

Latency: one owner holding 10,000 turns (LongMemEval's), 200 questions; the p50 of
``search(..., k=10)`` with the query's vector given (the store's own time), and with
the query embedded too (what a caller waits for). Hybrid search is timed right after
the load, then each mode after ``optimize()`` (what a deployment runs after bulk loads,
and PostgreSQL's autovacuum does on its own some time later). Baselines come from the
same run.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from collections import defaultdict
from collections.abc import Callable, Iterable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import numpy as np

from bench import _datasets as data
from bench.memory import fresh_postgres, postgres_admin
from statekeep.memory import MemoryInput, MemoryStore, Provenance, SearchMode, SentenceTransformerEmbedder
from statekeep.memory._types import Filters
from statekeep.memory.recall._ranking import fuse

KS = (1, 5, 10, 20)
MODES = ("vector", "text", "hybrid", "rrf")
DEFAULT_MODE = "hybrid"
RESULTS = Path(__file__).parent / "results" / "retrieval.json"
LATENCY_ROWS, LATENCY_QUERIES = 10_000, 200


class Clock:
    """The store's clock: set to each session's date while it is remembered."""

    def __init__(self) -> None:
        self.now = datetime(2020, 1, 1, tzinfo=UTC)

    def __call__(self) -> datetime:
        return self.now


Opener = Callable[[Any, Clock], MemoryStore]


def openers(backends: Iterable[str]) -> tuple[dict[str, Callable[[], Opener]], Any]:
    from statekeep.memory.lancedb import LanceDBMemoryStore
    from statekeep.memory.pgvector import PgVectorMemoryStore

    server: Any = None
    made: dict[str, Callable[[], Opener]] = {}
    if "lancedb" in backends:

        def lance() -> Opener:
            folder = Path(tempfile.mkdtemp(prefix="bench-retrieval-"))
            return lambda embedder, clock: LanceDBMemoryStore(folder, embedder, clock=clock)

        made["lancedb"] = lance
    if "pgvector" in backends:
        admin, server = postgres_admin()

        def pg() -> Opener:
            url = fresh_postgres(admin)
            return lambda embedder, clock: PgVectorMemoryStore(url, embedder, clock=clock)

        made["pgvector"] = pg
    return made, server


def content(turn: data.Turn) -> str:
    return f"{turn.speaker}: {turn.text}"


def ingest(
    store: MemoryStore,
    clock: Clock,
    turns: list[data.Turn],
    owner: str | None = None,
    *,
    optimize: bool = True,
) -> dict[str, str]:
    """Remember turns session by session, each at its session's date; return turn id -> memory id.

    ``optimize``: call ``store.optimize()`` every 200 sessions and at the end, as LanceDB's
    and PostgreSQL's documentation ask of bulk loads (LanceDB compacts the many small
    writes; PostgreSQL vacuums and analyzes).
    """
    sessions: dict[str, list[data.Turn]] = defaultdict(list)
    for t in turns:
        sessions[t.session].append(t)
    stands_for: dict[str, str] = {}
    for n, (session, ts) in enumerate(sessions.items(), start=1):
        if optimize and n % 200 == 0:
            store.optimize()
        clock.now = ts[0].at
        items = [
            MemoryInput(
                content(t),
                metadata={"turn": t.id, "speaker": t.speaker},
                provenance=Provenance("imported", session_id=session),
            )
            for t in ts
        ]
        for t, m in zip(ts, store.remember_many(owner or ts[0].owner, items), strict=True):
            stands_for[t.id] = m.id
    if optimize:
        store.optimize()
    return stands_for


def ranked(store: MemoryStore, q: data.Question, vector: np.ndarray, mode: str, k: int) -> list[str]:
    """The memory ids a search returns, best first."""
    if mode == "rrf":
        pool, now = max(4 * k, 20), store.now()  # the nearest by whole vector, and the full-text ranking
        both = [
            store._nearest(q.owner, vector, pool, Filters(), now),
            store._text(q.owner, q.text, pool, Filters(), now),
        ]
        return [h.memory.id for h in fuse(both, k)]
    return [h.memory.id for h in store.search(q.owner, q.text, k=k, mode=mode, vector=vector)]  # type: ignore[arg-type]


def recall(found: list[str], gold: set[str]) -> dict[int, float]:
    return {k: len(gold.intersection(found[:k])) / len(gold) for k in KS}


def summarize(rows: list[tuple[str, dict[int, float]]]) -> dict[str, Any]:
    """Mean recall@k over questions, in all and per category."""
    by_cat: dict[str, list[dict[int, float]]] = defaultdict(list)
    for cat, r in rows:
        by_cat[cat].append(r)

    def mean(rs: list[dict[int, float]]) -> dict[str, float]:
        return {str(k): round(float(np.mean([r[k] for r in rs])), 4) for k in KS}

    return {
        "n": len(rows),
        "all": mean([r for _, r in rows]),
        "by_category": {c: {"n": len(rs), **mean(rs)} for c, rs in sorted(by_cat.items())},
    }


def evaluate(
    open_store: Opener, ds: data.Dataset, owners: set[str], embedder: Any, qvecs: dict[str, np.ndarray]
) -> dict[str, dict[str, Any]]:
    """Ingest the owners' conversations into a fresh store; recall of every mode over their questions."""
    clock = Clock()
    store = open_store(embedder, clock)
    try:
        stands_for: dict[str, str] = {}
        for owner in sorted(owners):
            stands_for |= ingest(store, clock, ds.turns[owner])
        rows: dict[str, list[tuple[str, dict[int, float]]]] = defaultdict(list)
        for q in (q for q in ds.questions if q.owner in owners):
            clock.now = q.at  # asked at its date: "four weeks ago" is resolved from it
            gold = {stands_for[g] for g in q.gold}
            for mode in MODES:
                rows[mode].append((q.category, recall(ranked(store, q, qvecs[q.id], mode, max(KS)), gold)))
        return {mode: summarize(r) for mode, r in rows.items()}
    finally:
        store.close()


def latency(
    open_store: Opener, ds: data.Dataset, embedder: Any, real: Any, qvecs: dict[str, np.ndarray]
) -> dict[str, Any]:
    """Search p50 (ms) at LATENCY_ROWS memories of one owner, per mode; with and without embedding.

    Hybrid search is measured first right after the load (``hybrid_fresh_p50_ms``), then
    every mode after ``optimize()``.
    """
    clock = Clock()
    store = open_store(embedder, clock)
    try:
        turns = [t for owner in sorted(ds.turns) for t in ds.turns[owner]][:LATENCY_ROWS]
        ingest(store, clock, turns, owner="latency", optimize=False)
        questions = ds.questions[:LATENCY_QUERIES]
        out: dict[str, Any] = {"rows": len(turns), "queries": len(questions)}

        def p50(mode: SearchMode) -> float:
            times = []
            for q in questions:
                start = time.perf_counter()
                store.search("latency", q.text, k=10, mode=mode, vector=qvecs[q.id])  # type: ignore[arg-type]
                times.append(time.perf_counter() - start)
            return round(float(np.median(times)) * 1000, 2)

        out["hybrid_fresh_p50_ms"] = p50("hybrid")
        store.optimize()
        for mode in ("vector", "text", "hybrid"):
            out[f"{mode}_p50_ms"] = p50(mode)
        embed = []
        for q in questions[:50]:
            start = time.perf_counter()
            real.embed([q.text])
            embed.append(time.perf_counter() - start)
        out["query_embedding_p50_ms"] = round(float(np.median(embed)) * 1000, 2)
        return out
    finally:
        store.close()


def run(datasets: list[str], backends: list[str], *, small: bool, with_latency: bool) -> dict[str, Any]:
    real = SentenceTransformerEmbedder()
    embedder = data.CachedEmbedder(real, "turns")
    qembedder = data.CachedEmbedder(real, "questions")
    made, server = openers(backends)
    results: dict[str, Any] = {"small": small, "datasets": {}, "source": data.PACKAGE}
    try:
        for name in datasets:
            ds = data.LOADERS[name]()
            dev, held_out = data.split(ds, small=small)
            qs = [q for q in ds.questions if q.owner in dev | held_out]
            qvecs = dict(zip([q.id for q in qs], qembedder.embed([q.text for q in qs]), strict=True))
            per: dict[str, Any] = {"owners": {"dev": sorted(dev), "held_out": sorted(held_out)}}
            for backend, opener in made.items():
                per[backend] = {}
                for part, owners in (("dev", dev), ("held_out", held_out)):
                    if owners:
                        per[backend][part] = evaluate(opener(), ds, owners, embedder, qvecs)
                        embedder.save()
                        print(f"{name} {backend} {part}: " + table_line(per[backend][part]), flush=True)
                if with_latency and name == "longmemeval":
                    lq = {
                        q.id: v
                        for q, v in zip(
                            ds.questions, qembedder.embed([q.text for q in ds.questions]), strict=True
                        )
                    }
                    per[backend]["latency"] = latency(opener(), ds, embedder, real, lq)
                    print(f"{name} {backend} latency: {per[backend]['latency']}", flush=True)
            results["datasets"][name] = per
            qembedder.save()
    finally:
        if server is not None:
            server.cleanup()
    return results


def table_line(res: dict[str, Any]) -> str:
    return "  ".join(f"{m} r@10={res[m]['all']['10']:.3f}" for m in MODES)


def gain(res: dict[str, Any], k: str = "10") -> float:
    """How much the default mode's recall@k is above plain dense search (0.4 = 40%)."""
    return float(res[DEFAULT_MODE]["all"][k] / res["vector"]["all"][k] - 1)


def by_category(res: dict[str, Any], modes: Iterable[str]) -> list[str]:
    """The lines of a table of recall@10 per question category, a column per mode."""
    modes = list(modes)
    lines = ["| recall@10 by category | n | " + " | ".join(modes) + " |", "|---|---|" + "---|" * len(modes)]
    for c in sorted(res["vector"]["by_category"]):
        row = [f"{res[m]['by_category'][c]['10']:.3f}" for m in modes]
        lines.append(f"| {c} | {res['vector']['by_category'][c]['n']} | " + " | ".join(row) + " |")
    return lines


def report(results: dict[str, Any]) -> str:
    lines = []
    for name, per in results["datasets"].items():
        for backend in ("lancedb", "pgvector"):
            if backend not in per or "held_out" not in per[backend]:
                continue
            res = per[backend]["held_out"]
            n = res["vector"]["n"]
            lines.append(f"\n{name}, {backend}, held-out ({n} questions): recall@1/5/10/20")
            lines.append("| mode | @1 | @5 | @10 | @20 |\n|---|---|---|---|---|")
            for m in MODES:
                r = res[m]["all"]
                lines.append(f"| {m} | " + " | ".join(f"{r[str(k)]:.3f}" for k in KS) + " |")
            lines.append(f"{DEFAULT_MODE} recall@10 vs plain dense: {gain(res):+.1%}")
            lines.extend(by_category(res, MODES))
            if "latency" in per[backend]:
                lines.append(f"latency at 10,000 memories: {per[backend]['latency']}")
    return "\n".join(lines)


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.retrieval")
    parser.add_argument("--small", action="store_true", help="one held-out LoCoMo conversation, LanceDB")
    parser.add_argument("--datasets", nargs="+", choices=sorted(data.LOADERS))
    parser.add_argument("--backends", nargs="+", choices=["lancedb", "pgvector"])
    parser.add_argument("--json", type=Path, help="write the results here")
    parser.add_argument("--no-latency", action="store_true")
    args = parser.parse_args(argv)
    datasets = args.datasets or (["locomo"] if args.small else sorted(data.LOADERS))
    backends = args.backends or (["lancedb"] if args.small else ["lancedb", "pgvector"])
    try:
        results = run(datasets, backends, small=args.small, with_latency=not (args.small or args.no_latency))
    except data.Unreachable as exc:
        print(f"SKIP: {exc}", file=sys.stderr)
        return 3
    print(report(results))
    out = args.json or (None if args.small or args.datasets or args.backends else RESULTS)
    if out is not None:
        out.write_text(json.dumps(results, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
