"""Download the peer packages' source distributions (their test suites) into a cache folder.

``python tests/integrations/peers/fetch.py [DEST]`` (default ``.peers`` at the repository root):
``pip download --no-binary :all: --no-deps PKG==X`` for each pinned peer, then unpack. Their
code is never copied into this repository; the folder is git-ignored.
"""

from __future__ import annotations

import subprocess
import sys
import tarfile
from pathlib import Path

#: The pinned peers whose shipped tests run against the adapters.
PEERS = {
    "langgraph-checkpoint": "4.3.2",
    "openai-agents": "0.24.0",
}
ROOT = Path(__file__).resolve().parents[3]
DEFAULT = ROOT / ".peers"


def source_dir(dest: Path, package: str) -> Path:
    """Where a peer's unpacked sdist lives."""
    return dest / f"{package.replace('-', '_')}-{PEERS[package]}"


def fetch(dest: Path = DEFAULT) -> dict[str, Path]:
    """Download and unpack every peer sdist not already there; return their folders."""
    dest.mkdir(parents=True, exist_ok=True)
    out = {}
    for package, version in PEERS.items():
        folder = source_dir(dest, package)
        if not (folder / "tests").is_dir():
            subprocess.run(
                [
                    sys.executable,
                    "-m",
                    "pip",
                    "download",
                    "-q",
                    "--no-binary",
                    ":all:",
                    "--no-deps",
                    "-d",
                    str(dest),
                    f"{package}=={version}",
                ],
                check=True,
            )
            archive = dest / f"{package.replace('-', '_')}-{version}.tar.gz"
            with tarfile.open(archive) as tar:
                tar.extractall(dest, filter="data")
        out[package] = folder
    return out


if __name__ == "__main__":
    for package, folder in fetch(Path(sys.argv[1]) if len(sys.argv) > 1 else DEFAULT).items():
        print(f"{package}: {folder}")
