"""Reading a LanceDB folder's files directly, deleted rows included: what erasure checks look at."""

from __future__ import annotations

import json
from pathlib import Path


def decode_folder(path: str | Path) -> list[tuple[Path, str]]:
    """Every Lance file under ``path`` decoded to text (deleted rows included), for erasure checks.

    Returns (file, text) pairs; files Lance cannot decode are returned as their raw bytes.
    """
    from lance.file import LanceFileReader

    out = []
    for file in sorted(Path(path).rglob("*")):
        if not file.is_file():
            continue
        if file.stat().st_size == 0:  # holds nothing (the writer lock), and Lance's reader panics on it
            out.append((file, ""))
            continue
        try:
            table = LanceFileReader(str(file)).read_all().to_table()
            out.append((file, json.dumps(table.to_pylist(), default=str, ensure_ascii=False)))
        except Exception:  # not a Lance file (manifest, lock, transaction): check its bytes
            out.append((file, file.read_bytes().decode("utf-8", "replace")))
    return out
