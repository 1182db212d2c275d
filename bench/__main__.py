"""Run every benchmark module in turn: ``python -m bench [name ...]``."""

from __future__ import annotations

import importlib
import pkgutil
import sys
from pathlib import Path


def main(argv: list[str]) -> int:
    here = Path(__file__).parent
    names = argv or sorted(
        m.name for m in pkgutil.iter_modules([str(here)]) if not m.name.startswith("_") and m.name != "common"
    )
    for name in names:
        print(f"\n=== bench.{name} ===", flush=True)
        module = importlib.import_module(f"bench.{name}")
        code = module.main([])
        if code:
            return int(code)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
