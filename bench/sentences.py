"""What a vector per sentence would add to hybrid search: a prototype, measured on the retrieval benchmark.

    PYTHONPATH=src python -m bench.sentences                 # LoCoMo and LongMemEval
    PYTHONPATH=src python -m bench.sentences --datasets locomo --json out.json
    PYTHONPATH=src python -m bench.sentences --small     # retrieval's --small owner (a test)

Not a feature of statekeep yet: it measures one before it is built. A memory has one
vector, of its whole text, and all-MiniLM-L6-v2 reads at most 256 tokens of it. What a
person tells a chat assistant often hides one fact in a longer request ("Can you
suggest workout playlists? By the way, I take Zumba on Tuesdays"), and the vector of
the whole is mostly the request. Here each memory of two or more sentences also has a
vector per sentence (at most :data:`MAX_PARTS`), and in a hybrid search every
candidate's vector score is the best of its whole vector and its sentences'.

It reproduces LanceDB's hybrid search in process, from statekeep's own parts: the
same memories (exact duplicates standing for the first, as ``dedupe="exact"`` does),
unit vectors and exact cosine (what LanceDB computes at this size), BM25 over the
owner's memories (:class:`statekeep.memory._bm25.TextIndex`, as the store ranks) and
the store's fusion (:func:`statekeep.memory._ranking.fuse_scores`). Its ``vector`` and
``hybrid`` rows must equal the store's in ``bench/results/retrieval.json``, overall and
by category (checked when that file has the dataset; the test suite checks it on one
owner). ``hybrid+sentences`` then changes the fusion and adds the sentences: the vector
ranking scores every candidate of either ranking (the store scores only its own 50),
by the best of its whole vector's and its sentences' cosine, with the vector weight
chosen on the development split (:data:`SENTENCES`). ``hybrid+union`` is that fusion
with whole vectors only, so the two rows part what the fusion adds from what the
sentences add. The ``/short`` modes give sentence vectors only to memories of at most
:data:`SHORT_CHARS` characters. Write cost: the time to embed a batch of memories with
their sentences (every memory's, or the short ones') against without, interleaved
rounds, medians. ``--max-parts`` changes how many sentences a memory keeps.
"""

from __future__ import annotations

import argparse
import json
import random
import re
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
from statekeep.memory import Memory, Provenance, SearchResult, SentenceTransformerEmbedder, _bm25
from statekeep.memory._bm25 import TextIndex
from statekeep.memory._dedupe import identity
from statekeep.memory._exact import nearest
from statekeep.memory._ranking import LENGTH_PIVOT, Fusion, fuse_scores
from statekeep.memory.embedders import normalize

OUT = Path(__file__).parent / "results" / "sentences.json"
#: A memory's sentences: split after . ! ? and at line breaks; a piece of fewer than
#: ``MIN_WORDS`` words joins the one before ("Yes. Thanks!" is one).
_SPLIT = re.compile(r"(?<=[.!?])\s+|\n+")
MIN_WORDS = 4
#: Sentences embedded per memory, at most (the first ones); ``--max-parts``.
MAX_PARTS = 16
#: The second form measured: only memories no longer than the length prior's pivot get
#: sentence vectors; the long ones, scored down anyway, keep one vector.
SHORT_CHARS = LENGTH_PIVOT
#: The fusion of the ``hybrid+`` modes, chosen on the development split (vector weight 0.3 to
#: 0.6, 50 or 100 candidates of each ranking, length weight 1 or 2).
SENTENCES = Fusion(vector_weight=0.5)
#: ``sentences``: dense search by the best of whole and sentences (``/short``: sentences of the
#: short memories only). ``hybrid+union``, the control: the ``hybrid+sentences`` fusion (every
#: candidate of either ranking scored by its cosine, ``SENTENCES``) with whole vectors only.
MODES = (
    "vector",
    "sentences",
    "sentences/short",
    "hybrid",
    "hybrid+union",
    "hybrid+sentences",
    "hybrid+sentences/short",
)


def sentences(text: str, most: int = MAX_PARTS) -> list[str]:
    """The first ``most`` sentences of a memory's text, when it has two or more (else none)."""
    out: list[str] = []
    for piece in (p.strip() for p in _SPLIT.split(text)):
        if not piece:
            continue
        if out and len(piece.split()) < MIN_WORDS:
            out[-1] += " " + piece
        else:
            out.append(piece)
    return out[:most] if len(out) > 1 else []


@dataclass
class Owner:
    """One owner's memories in write order, their vectors, sentences' vectors and words."""

    memories: list[Memory]
    stands_for: dict[str, int]  # turn id -> position of the memory that stores it
    matrix: np.ndarray
    parts: np.ndarray  # one row per sentence
    part_of: np.ndarray  # the memory of each sentence
    short: np.ndarray  # memories of at most SHORT_CHARS characters
    words: TextIndex


def load_owner(turns: list[data.Turn], embedder: Any, most: int) -> Owner:
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
                    metadata={}, provenance=Provenance("imported", session_id=t.session),
                    model=embedder.name, created_at=t.at, seq=len(memories) + 1,
                )
            )  # fmt: skip
        stands_for[t.id] = seen[ident]
    texts = [m.content for m in memories]
    split = [sentences(text, most) for text in texts]
    part_of = np.array([i for i, ss in enumerate(split) for _ in ss], dtype=np.int64)
    parts = [s for ss in split for s in ss]
    return Owner(
        memories,
        stands_for,
        normalize(embedder.embed(texts)),
        normalize(embedder.embed(parts)) if parts else np.zeros((0, embedder.dimension), dtype=np.float32),
        part_of,
        np.array([len(text) <= SHORT_CHARS for text in texts], dtype=bool),
        TextIndex(texts),
    )


def ranked(o: Owner, query: str, vector: np.ndarray, k: int) -> dict[str, list[str]]:
    """The ids each mode returns, best first: each ranking and cosine computed once for all modes."""
    whole = o.matrix @ vector
    cosines = {
        "hybrid+union": whole,
        "hybrid+sentences": best_cosine(o, whole, vector, short=False),
        "hybrid+sentences/short": best_cosine(o, whole, vector, short=True),
    }
    out = {"vector": [h.memory.id for h in nearest(o.memories, o.matrix, vector, k)]}  # as the store
    for form in ("", "/short"):
        best = cosines[f"hybrid+sentences{form}"]
        out[f"sentences{form}"] = [o.memories[int(i)].id for i in np.argsort(-best, kind="stable")[:k]]
    pools: dict[int, tuple[list[SearchResult], list[SearchResult]]] = {}
    for mode, fusion in (("hybrid", Fusion()), *((mode, SENTENCES) for mode in cosines)):
        pool = max(k, fusion.pool)  # as the store's hybrid search
        if pool not in pools:
            everyone = np.ones(len(o.memories), dtype=bool)
            near = nearest(o.memories, o.matrix, vector, pool)
            pools[pool] = near, _bm25.ranked(o.words, o.memories, query, everyone, pool)
        near, text = pools[pool]
        if mode != "hybrid":  # every candidate of either ranking, by its cosine
            candidates, cosine = {h.memory.id for h in (*near, *text)}, cosines[mode]
            near = [SearchResult(m, float(cosine[i])) for i, m in enumerate(o.memories) if m.id in candidates]
        out[mode] = [h.memory.id for h in fuse_scores(near, text, k, fusion)]
    return out


def best_cosine(o: Owner, whole: np.ndarray, vector: np.ndarray, *, short: bool) -> np.ndarray:
    """Each memory's best cosine with ``vector``: its whole vector's (``whole``) or a sentence's."""
    best = whole.copy()
    if len(o.parts):
        used = o.short[o.part_of] if short else np.ones(len(o.part_of), dtype=bool)
        np.maximum.at(best, o.part_of[used], o.parts[used] @ vector)
    return best


def evaluate(
    ds: data.Dataset, owners: set[str], embedder: Any, qvecs: dict[str, np.ndarray], most: int
) -> dict[str, Any]:
    rows: dict[str, list[tuple[str, dict[int, float]]]] = defaultdict(list)
    for name in sorted(owners):
        o = load_owner(ds.turns[name], embedder, most)
        embedder.save()
        for q in (q for q in ds.questions if q.owner == name):
            gold = {o.memories[o.stands_for[g]].id for g in q.gold}
            for mode, found in ranked(o, q.text, qvecs[q.id], max(KS)).items():
                rows[mode].append((q.category, recall(found, gold)))
    return {mode: summarize(rows[mode]) for mode in MODES}


def write_cost(ds: data.Dataset, real: Any, most: int, n: int = 300, rounds: int = 3) -> dict[str, Any]:
    """Milliseconds a memory to embed ``n`` random memories in one batch: alone, with every one's
    sentences, and with the sentences of the short ones only (interleaved rounds; medians).

    A batch's throughput, not the latency of one ``remember``, which embeds a few texts in
    numpy rather than through sentence-transformers (:mod:`statekeep.memory._bert`).
    """
    turns = [t for owner in sorted(ds.turns) for t in ds.turns[owner]]
    texts = [content(t) for t in random.Random(7).sample(turns, n)]
    forms = {
        "alone": [],
        "sentences": [s for text in texts for s in sentences(text, most)],
        "sentences/short": [s for text in texts if len(text) <= SHORT_CHARS for s in sentences(text, most)],
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


def run(datasets: list[str], *, small: bool = False, most: int = MAX_PARTS) -> dict[str, Any]:
    real = SentenceTransformerEmbedder()
    embedder = data.CachedEmbedder(real, "turns")  # the sentences too: one cache of stored texts
    qembedder = data.CachedEmbedder(real, "questions")
    stored = json.loads(RESULTS.read_text())["datasets"] if RESULTS.is_file() and not small else {}
    results: dict[str, Any] = {
        "datasets": {},
        "source": data.PACKAGE,
        "fusion": vars(SENTENCES),
        "sentences": {"max_parts": most, "short_chars": SHORT_CHARS},
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
            per[part] = evaluate(ds, owners, embedder, qvecs, most)
            print(
                f"{name} {part}: " + "  ".join(f"{m} {per[part][m]['all']['10']:.3f}" for m in MODES),
                flush=True,
            )
            store = stored.get(name, {}).get("lancedb", {}).get(part, {})
            for mode in ("vector", "hybrid"):  # overall and by category, recall@1/5/10/20
                if mode in store and store[mode] != per[part][mode]:
                    raise SystemExit(f"{name} {part}: {mode} in process differs from the store's")
        per["write_cost"] = write_cost(ds, real, most, n=30 if small else 300)
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
            for m in MODES:
                r = res[m]["all"]
                g = r["10"] / res["vector"]["all"]["10"] - 1
                lines.append(f"| {m} | " + " | ".join(f"{r[str(k)]:.3f}" for k in KS) + f" | {g:+.1%} |")
            lines.extend(by_category(res, MODES))
        lines.append(f"write cost: {per['write_cost']}")
    return "\n".join(lines)


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.sentences")
    parser.add_argument("--datasets", nargs="+", choices=sorted(data.LOADERS))
    parser.add_argument("--small", action="store_true", help="the smallest held-out owner of each dataset")
    parser.add_argument("--json", type=Path, help="write the results here")
    parser.add_argument("--max-parts", type=int, default=MAX_PARTS, help="sentences per memory, at most")
    args = parser.parse_args(argv)
    if args.max_parts < 1:
        parser.error("--max-parts must be at least 1")
    default = not (args.datasets or args.small or args.max_parts != MAX_PARTS)
    try:
        small = args.small
        datasets = args.datasets or (["locomo"] if small else sorted(data.LOADERS))
        results = run(datasets, small=small, most=args.max_parts)
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
