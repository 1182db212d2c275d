"""List the benchmarks; each runs as ``python -m bench.<name>``."""

from pathlib import Path

if __name__ == "__main__":
    names = sorted(p.stem for p in Path(__file__).parent.glob("*.py") if not p.stem.startswith("_"))
    print("benchmarks:", ", ".join(names), "- run one with: python -m bench.<name>")
