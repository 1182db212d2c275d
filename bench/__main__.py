"""Run every benchmark in turn, each in its own process: ``python -m bench [name ...]``."""

from __future__ import annotations

import pkgutil
import subprocess
import sys
from pathlib import Path

#: Benchmarks run only when named: they need packages statekeep does not install.
OPTIONAL = {"libraries"}


def main(argv: list[str]) -> int:
    here = Path(__file__).parent
    names = argv or sorted(
        m.name
        for m in pkgutil.iter_modules([str(here)])
        if not m.name.startswith("_") and m.name not in OPTIONAL
    )
    for name in names:
        print(f"\n=== bench.{name} ===", flush=True)
        code = subprocess.call([sys.executable, "-m", f"bench.{name}"], cwd=here.parent)
        if code:
            return code
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
