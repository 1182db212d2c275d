"""Start-up, timed as whole processes: ``import statekeep``, a memory search from the command line, the demo.

``python -m bench.startup`` (PYTHONPATH=src) runs each command ``--runs`` times
(the demo ``--demo-runs`` times), in turns with its floor so that both see the
same machine load, and prints median, min and max wall seconds:

* ``import statekeep``, next to ``python -c pass`` (the interpreter alone);
* ``statekeep memory search`` on a folder with a few memories, the embedding
  model loaded by the command itself, next to ``python -c "import lancedb"``
  (the memory backend's own import);
* ``statekeep demo`` (crashes a worker, waits for an approval, erases a memory),
  next to nothing: its target is absolute (30 s), and it says what it waits
  for whenever a second passes in silence (the longest silence is reported).

Results go to ``bench/results/startup.json``.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

RESULTS = Path(__file__).parent / "results" / "startup.json"
SRC = str(Path(__file__).resolve().parents[1] / "src")
ENV = {
    **os.environ,
    "PYTHONPATH": SRC,
    "HF_HUB_OFFLINE": "1",
    "TOKENIZERS_PARALLELISM": "false",
    "COLUMNS": "100",
}
CLI = [sys.executable, "-m", "statekeep"]


def wall(cmd: list[str]) -> tuple[float, str]:
    """Seconds a command takes from start to exit, and its output; it must succeed."""
    start = time.perf_counter()
    done = subprocess.run(cmd, env=ENV, capture_output=True, text=True)
    took = time.perf_counter() - start
    if done.returncode:
        raise SystemExit(f"{' '.join(cmd)} failed:\n{done.stdout}\n{done.stderr}")
    return took, done.stdout


def summary(xs: list[float]) -> dict[str, float]:
    return {"median_s": statistics.median(xs), "min_s": min(xs), "max_s": max(xs)}


def paired(subject: list[str], floor: list[str], runs: int) -> dict[str, Any]:
    """``subject`` and ``floor`` timed in turns, ``runs`` times each (after one untimed warm-up each)."""
    wall(subject)
    wall(floor)
    a, b = [], []
    for _ in range(runs):
        a.append(wall(subject)[0])
        b.append(wall(floor)[0])
    return {**summary(a), "floor": summary(b), "ratio_to_floor": statistics.median(a) / statistics.median(b)}


def longest_silence(cmd: list[str]) -> tuple[float, float]:
    """Wall seconds of a command, and the longest gap between two lines of its output."""
    start = last = time.perf_counter()
    gap, lines = 0.0, []
    with subprocess.Popen(cmd, env=ENV, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True) as proc:
        for line in proc.stdout or ():
            now = time.perf_counter()
            gap, last = max(gap, now - last), now
            lines.append(line)
        if proc.wait():
            raise SystemExit(f"{' '.join(cmd)} failed:\n{''.join(lines[-30:])}")
    return time.perf_counter() - start, gap


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.startup", description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=7, help="timed runs of each command")
    parser.add_argument("--demo-runs", type=int, default=2, help="timed runs of the demo (0: skip it)")
    args = parser.parse_args(argv)
    results: dict[str, Any] = {"cpu_count": os.cpu_count(), "runs": args.runs}
    results["import_statekeep"] = paired(
        [sys.executable, "-c", "import statekeep"], [sys.executable, "-c", "pass"], args.runs
    )
    _print("import statekeep", results["import_statekeep"])
    with tempfile.TemporaryDirectory() as home:
        for fact in ("Alice prefers green tea in the morning.", "Alice's train leaves at 7:40 on Mondays."):
            wall([*CLI, "memory", "add", "alice", fact, "--home", home])
        search = [*CLI, "memory", "search", "alice", "what does Alice drink?", "--home", home, "--json"]
        if "green tea" not in wall(search)[1]:
            raise SystemExit("the search did not find the memory")
        results["memory_search_cli"] = paired(search, [sys.executable, "-c", "import lancedb"], args.runs)
        _print("statekeep memory search", results["memory_search_cli"])
    if args.demo_runs:
        runs = []
        for _ in range(args.demo_runs):
            with tempfile.TemporaryDirectory() as home:
                runs.append(longest_silence([*CLI, "demo", "--home", home]))
        results["demo"] = {
            **summary([w for w, _ in runs]),
            "longest_silence_s": max(g for _, g in runs),
        }
        _print("statekeep demo", results["demo"])
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_text(json.dumps(results, indent=2) + "\n")
    print(f"wrote {RESULTS}")
    return 0


def _print(title: str, values: dict[str, Any]) -> None:
    floor = values.get("floor")
    line = f"{title:28s} median {values['median_s']:6.2f} s  [{values['min_s']:.2f}-{values['max_s']:.2f}]"
    if floor:
        line += f"  floor {floor['median_s']:.2f} s  ratio {values['ratio_to_floor']:.1f}x"
    if "longest_silence_s" in values:
        line += f"  longest silence {values['longest_silence_s']:.1f} s"
    print(line, flush=True)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
