"""What each part of hybrid search adds, sentence vectors most of all: an ablation on the retrieval benchmark.

    PYTHONPATH=src python -m bench.sentences                 # LoCoMo and LongMemEval
    PYTHONPATH=src python -m bench.sentences --datasets locomo --json out.json
    PYTHONPATH=src python -m bench.sentences --small     # retrieval's --small owner (a test)

A memory of two or more sentences and at most ``SENTENCE_CHARS`` characters keeps a
vector per sentence (:mod:`statekeep.memory.recall._sentences`), and hybrid search scores every
candidate of either ranking by its best cosine. This rebuilds LanceDB's hybrid search in
process from statekeep's own parts (the same memories, exact duplicates standing for
the first as ``dedupe="exact"`` does; unit vectors and exact cosine; BM25 over the
owner's memories, :class:`statekeep.memory.recall._bm25.TextIndex`; the store's fusion,
:func:`statekeep.memory.recall._ranking.fuse_scores`) and takes it apart. Its ``vector`` and
``hybrid`` rows must equal the store's in ``bench/results/retrieval.json``, overall and
by category (checked when that file has the dataset; the test suite checks it on one
owner). The other rows:

* ``hybrid/before``: the fusion before sentences: vector weight 0.3, and the vector
  ranking scores only its own candidates, by their whole vector;
* ``hybrid/union``: the vector ranking scores every candidate of either ranking (weight
  0.5), by its whole vector only: what the fusion adds without sentences (with the
  period a query names, as the store);
* ``hybrid/no-time``: the store's search without the period a query names
  (:mod:`statekeep.memory.recall._when`; ``Fusion(time_weight=0)``);
* ``hybrid/no-opener``: the store's search without the lift of the memory that opens its
  session (``Fusion(opener_weight=0)``);
* ``hybrid/all-sentences``: sentences for memories of any length (the write costs more);
* with ``--stages``, ``hybrid/without-<stage>`` for each stage of hybrid search in order
  (:data:`statekeep.memory.recall._ranking.STAGES`: ``bm25``, ``speaker``, ``opener``,
  ``context``, ``length``, ``time``): the store's search with that one stage left out
  (``Fusion(without=(stage,))``);
* ``sentences``: plain dense search by the best cosine, for comparison with ``vector``.

Write cost: the time to embed a batch of memories with the sentences the store keeps
(``sentences/short``) and with every memory's (``sentences``), against without,
interleaved rounds, medians.
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import time
from collections import defaultdict
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import numpy as np

from bench import _datasets as data
from bench.retrieval import KS, RESULTS, by_category, content, recall, summarize
from statekeep.memory import Memory, Provenance, SearchResult, SentenceTransformerEmbedder
from statekeep.memory._dedupe import identity
from statekeep.memory.embedders import normalize
from statekeep.memory.recall import _bm25, _when
from statekeep.memory.recall._bm25 import TextIndex
from statekeep.memory.recall._exact import nearest
from statekeep.memory.recall._ranking import STAGES, Fusion, fuse_scores, openers_among
from statekeep.memory.recall._sentences import SENTENCE_CHARS, sentences

OUT = Path(__file__).parent / "results" / "sentences.json"
#: The fusion before sentence vectors (its vector weight), before periods named by the query and
#: before the agent's words were weighed down (with the neighbour share of then).
BEFORE = Fusion(vector_weight=0.3, time_weight=0, context_weight=0.4, assistant_weight=1, opener_weight=0)
#: The store's fusion without the period a query names.
NO_TIME = Fusion(without=("time",))
#: The store's fusion without the lift of a session's first memory.
NO_OPENER = Fusion(without=("opener",))
#: With ``--stages``: the store's fusion less one stage of hybrid search, for each stage by name.
STAGE_MODES = {f"hybrid/without-{name}": Fusion(without=(name,)) for name in STAGES}
MODES = (
    "vector",
    "sentences",
    "hybrid/before",
    "hybrid/union",
    "hybrid/no-time",
    "hybrid/no-opener",
    "hybrid",
    "hybrid/all-sentences",
)


@dataclass
class Owner:
    """One owner's memories in write order, their vectors, sentences' vectors and words."""

    memories: list[Memory]
    stands_for: dict[str, int]  # turn id -> position of the memory that stores it
    matrix: np.ndarray
    parts: np.ndarray  # one row per sentence
    part_of: np.ndarray  # the memory of each sentence
    short: np.ndarray  # memories of at most SENTENCE_CHARS characters: the store keeps their sentences
    words: TextIndex
    openers: set[str]  # the memories that open their session


def load_owner(turns: list[data.Turn], embedder: Any) -> Owner:
    """The owner's memories as the store keeps them: repeats stand for the first; unit vectors."""
    memories: list[Memory] = []
    stands_for: dict[str, int] = {}
    seen: dict[str, int] = {}
    for t in turns:
        ident = identity(content(t), None)
        if ident not in seen:
            seen[ident] = len(memories)
            memories.append(
                Memory(
                    id=t.id, owner=t.owner, content=content(t), kind="episodic", tags=(),
                    metadata={"speaker": t.speaker}, provenance=Provenance("imported", session_id=t.session),
                    model=embedder.name, created_at=t.at, seq=len(memories) + 1,
                )
            )  # fmt: skip
        stands_for[t.id] = seen[ident]
    texts = [m.content for m in memories]
    split = [sentences(text) for text in texts]
    part_of = np.array([i for i, ss in enumerate(split) for _ in ss], dtype=np.int64)
    parts = [s for ss in split for s in ss]
    return Owner(
        memories,
        stands_for,
        normalize(embedder.embed(texts)),
        normalize(embedder.embed(parts)) if parts else np.zeros((0, embedder.dimension), dtype=np.float32),
        part_of,
        np.array([len(text) <= SENTENCE_CHARS for text in texts], dtype=bool),
        TextIndex(texts),
        openers_among(memories, memories),
    )


def ranked(
    o: Owner, query: str, vector: np.ndarray, k: int, now: datetime, *, stages: bool = False
) -> dict[str, list[str]]:
    """The ids each mode returns, best first: each ranking and cosine computed once for all modes.

    ``now``: the question's time, at which the period it names is resolved (:mod:`._when`);
    ``stages``: the modes of :data:`STAGE_MODES` too.
    """
    whole = o.matrix @ vector
    cosines = {
        "hybrid/union": whole,
        "hybrid": best_cosine(o, whole, vector, short=True),
        "hybrid/all-sentences": best_cosine(o, whole, vector, short=False),
    }
    out = {"vector": [h.memory.id for h in nearest(o.memories, o.matrix, vector, k)]}  # as the store
    out["sentences"] = [o.memories[int(i)].id for i in np.argsort(-cosines["hybrid"], kind="stable")[:k]]
    pool = max(k, Fusion().pool)  # as the store's hybrid search
    near = nearest(o.memories, o.matrix, vector, pool)
    everything = np.ones(len(o.memories), dtype=bool)
    text = _bm25.ranked(o.words, o.memories, query, everything, pool)
    out["hybrid/before"] = [h.memory.id for h in fuse_scores(near, text, k, BEFORE)]
    candidates = {h.memory.id for h in (*near, *text)}
    period = _when.window(query, now)
    timed = set(candidates)
    if period is not None:  # the memories of that period are candidates too, as the store's second search
        since, until = period
        during = np.array([since <= m.created_at < until for m in o.memories], dtype=bool)
        if during.any():
            more = (
                *nearest(o.memories, o.matrix, vector, pool, during),
                *_bm25.ranked(o.words, o.memories, query, during, pool),
            )
            timed |= {h.memory.id for h in more}
    fusions = {mode: Fusion() for mode in cosines} | {
        "hybrid/no-time": NO_TIME,
        "hybrid/no-opener": NO_OPENER,
    }
    if stages:
        fusions |= STAGE_MODES
    for mode, fusion in fusions.items():  # every candidate of either ranking, by its cosine
        cosine = cosines.get(mode, cosines["hybrid"])
        untimed = "time" not in fusion.stages or fusion.time_weight == 0  # as the store reads no period
        ids = candidates if untimed else timed
        scored = [SearchResult(m, float(cosine[i])) for i, m in enumerate(o.memories) if m.id in ids]
        hits = fuse_scores(scored, text, k, fusion, None if untimed else period, query, o.openers)
        out[mode] = [h.memory.id for h in hits]
    return out


def best_cosine(o: Owner, whole: np.ndarray, vector: np.ndarray, *, short: bool) -> np.ndarray:
    """Each memory's best cosine with ``vector``: its whole vector's (``whole``) or a sentence's."""
    best = whole.copy()
    if len(o.parts):
        used = o.short[o.part_of] if short else np.ones(len(o.part_of), dtype=bool)
        np.maximum.at(best, o.part_of[used], o.parts[used] @ vector)
    return best


def evaluate(
    ds: data.Dataset, owners: set[str], embedder: Any, qvecs: dict[str, np.ndarray], modes: tuple[str, ...]
) -> dict[str, Any]:
    rows: dict[str, list[tuple[str, dict[int, float]]]] = defaultdict(list)
    for name in sorted(owners):
        o = load_owner(ds.turns[name], embedder)
        embedder.save()
        for q in (q for q in ds.questions if q.owner == name):
            gold = {o.memories[o.stands_for[g]].id for g in q.gold}
            found_by = ranked(o, q.text, qvecs[q.id], max(KS), q.at, stages=len(modes) > len(MODES))
            for mode, found in found_by.items():
                rows[mode].append((q.category, recall(found, gold)))
    return {mode: summarize(rows[mode]) for mode in modes}


def write_cost(ds: data.Dataset, real: Any, n: int = 300, rounds: int = 3) -> dict[str, Any]:
    """Milliseconds a memory to embed ``n`` random memories in one batch: alone, with every one's
    sentences, and with the sentences of the short ones only, as the store keeps them
    (interleaved rounds; medians).

    A batch's throughput, not the latency of one ``remember``, which embeds a few texts in
    numpy rather than through sentence-transformers (:mod:`statekeep.memory._bert`).
    """
    turns = [t for owner in sorted(ds.turns) for t in ds.turns[owner]]
    texts = [content(t) for t in random.Random(7).sample(turns, n)]
    forms = {
        "alone": [],
        "sentences": [s for text in texts for s in sentences(text)],
        "sentences/short": [s for text in texts if len(text) <= SENTENCE_CHARS for s in sentences(text)],
    }
    times: dict[str, list[float]] = {form: [] for form in forms}
    for _ in range(rounds):
        for form, parts in forms.items():
            start = time.perf_counter()
            real.embed(texts + parts)
            times[form].append(time.perf_counter() - start)
    ms = {form: float(np.median(t)) / n * 1000 for form, t in times.items()}
    return {
        "memories": n,
        **{f"{form}_per_memory": round(len(p) / n, 2) for form, p in forms.items() if form != "alone"},
        **{f"embed_ms_per_memory_{form}": round(v, 2) for form, v in ms.items()},
        **{f"ratio_{form}": round(v / ms["alone"], 2) for form, v in ms.items() if form != "alone"},
    }


def run(datasets: list[str], *, small: bool = False, stages: bool = False) -> dict[str, Any]:
    """The ablation on ``datasets``; ``stages``: each stage of hybrid search left out too."""
    modes = (*MODES, *STAGE_MODES) if stages else MODES
    real = SentenceTransformerEmbedder()
    embedder = data.CachedEmbedder(real, "turns")  # the sentences too: one cache of stored texts
    qembedder = data.CachedEmbedder(real, "questions")
    stored = json.loads(RESULTS.read_text())["datasets"] if RESULTS.is_file() and not small else {}
    results: dict[str, Any] = {
        "datasets": {},
        "source": data.PACKAGE,
        "fusion": vars(Fusion()),
        "before": vars(BEFORE),
        "sentence_chars": SENTENCE_CHARS,
    }
    for name in datasets:
        ds = data.LOADERS[name]()
        vectors = normalize(qembedder.embed([q.text for q in ds.questions]))  # as search() does
        qvecs = dict(zip([q.id for q in ds.questions], vectors, strict=True))
        qembedder.save()
        per: dict[str, Any] = {}
        dev, held_out = data.split(ds, small=small)
        for part, owners in (("dev", dev), ("held_out", held_out)):
            if not owners:
                continue
            per[part] = evaluate(ds, owners, embedder, qvecs, modes)
            print(
                f"{name} {part}: " + "  ".join(f"{m} {per[part][m]['all']['10']:.3f}" for m in modes),
                flush=True,
            )
            store = stored.get(name, {}).get("lancedb", {}).get(part, {})
            for mode in ("vector", "hybrid"):  # overall and by category, recall@1/5/10/20
                if mode in store and store[mode] != per[part][mode]:
                    raise SystemExit(f"{name} {part}: {mode} in process differs from the store's")
        per["write_cost"] = write_cost(ds, real, n=30 if small else 300)
        print(f"{name} write cost: {per['write_cost']}", flush=True)
        results["datasets"][name] = per
    return results


def report(results: dict[str, Any]) -> str:
    lines = []
    for name, per in results["datasets"].items():
        for part in ("dev", "held_out"):
            if part not in per:
                continue
            res = per[part]
            lines.append(f"\n{name}, {part} ({res['vector']['n']} questions): recall@1/5/10/20, @10 vs dense")
            lines.append("| mode | @1 | @5 | @10 | @20 | @10 vs dense |\n|---|---|---|---|---|---|")
            modes = [m for m in (*MODES, *STAGE_MODES) if m in res]
            for m in modes:
                r = res[m]["all"]
                g = r["10"] / res["vector"]["all"]["10"] - 1
                lines.append(f"| {m} | " + " | ".join(f"{r[str(k)]:.3f}" for k in KS) + f" | {g:+.1%} |")
            lines.extend(by_category(res, modes))
        lines.append(f"write cost: {per['write_cost']}")
    return "\n".join(lines)


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.sentences")
    parser.add_argument("--datasets", nargs="+", choices=sorted(data.LOADERS))
    parser.add_argument("--small", action="store_true", help="the smallest held-out owner of each dataset")
    parser.add_argument("--json", type=Path, help="write the results here")
    parser.add_argument(
        "--stages", action="store_true", help="also each stage of hybrid search left out, by name"
    )
    args = parser.parse_args(argv)
    default = not (args.datasets or args.small)
    try:
        small = args.small
        datasets = args.datasets or (["locomo"] if small else sorted(data.LOADERS))
        results = run(datasets, small=small, stages=args.stages)
    except data.Unreachable as exc:
        print(f"SKIP: {exc}", file=sys.stderr)
        return 3
    results["at"] = datetime.now(UTC).isoformat(timespec="seconds")
    print(report(results))
    out = args.json or (OUT if default else None)
    if out is not None:
        out.write_text(json.dumps(results, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
