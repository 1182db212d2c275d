"""Byte scans for erasure tests: what a person holding the disk (and the key file) could read back.

Two levels: ``plain_hits`` looks for markers in the raw bytes of files, as they
are; ``recoverable_hits`` also plays the attacker who has the whole disk,
including the local key file: it finds every wrapped data key and every sealed
token in the raw bytes (live rows, dead tuples, free pages, WAL frames alike),
unwraps what it can with the key file's keys, opens what it can, and looks for
the markers in the plain text it gets.
"""

from __future__ import annotations

import base64
import json
import re
from collections.abc import Iterable
from pathlib import Path

import psycopg
from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives.ciphers.aead import AESGCM
from sqlalchemy.engine import make_url

_TOKEN = re.compile(rb"sk1:([0-9a-f]{20}):([A-Za-z0-9+/]+={0,2})")
#: runs of base64 that may hold a wrapped data key (a 12-byte nonce, a 32-byte key and a 16-byte tag: 80
#: characters), maybe run together with the bytes of the columns beside it
_RUN = re.compile(rb"[A-Za-z0-9+/]{80,400}")


def sqlite_files(url: str) -> list[Path]:
    """The SQLite database of ``url`` and its ``-wal`` and ``-shm`` files, those that exist."""
    path = Path(make_url(url).database or "")
    return [p for p in (path, Path(f"{path}-wal"), Path(f"{path}-shm")) if p.exists()]


def postgres_files(url: str) -> list[Path]:
    """Every relation file of the database (heaps, TOAST, indexes, catalogs, pg_statistic), checkpointed."""
    libpq = make_url(url).set(drivername="postgresql").render_as_string(hide_password=False)
    with psycopg.connect(libpq, autocommit=True) as conn:
        conn.execute("CHECKPOINT")
        data_dir = conn.execute("SHOW data_directory").fetchone()[0]  # type: ignore[index]
        oid = conn.execute("SELECT oid FROM pg_database WHERE datname = current_database()").fetchone()[0]  # type: ignore[index]
    folder = Path(data_dir) / "base" / str(oid)
    assert folder.is_dir(), f"cannot read the data directory {folder}: run the tests on the server's machine"
    return [p for p in folder.iterdir() if p.is_file()]


def folder_files(folder: Path) -> list[Path]:
    return [p for p in folder.rglob("*") if p.is_file()]


def _contents(files: Iterable[Path]) -> list[bytes]:
    """The bytes of each file still there: PostgreSQL deletes some files at any time (a database's
    relation cache file, ``pg_internal.init``, when a catalog changes), and a file gone holds nothing."""
    blobs = []
    for f in files:
        try:
            blobs.append(f.read_bytes())
        except FileNotFoundError:
            continue
    return blobs


def plain_hits(files: Iterable[Path], markers: Iterable[str], decoded: Iterable[str] = ()) -> set[str]:
    """The markers found as plain bytes in ``files`` (or in already decoded texts)."""
    blobs = _contents(files) + [t.encode() for t in decoded]
    return {m for m in markers if any(m.encode() in blob for blob in blobs)}


def recoverable_hits(
    files: Iterable[Path], key_file: Path, owners: Iterable[str], markers: Iterable[str]
) -> set[str]:
    """The markers an attacker with these files and the key file recovers: plain, or sealed and opened."""
    blobs = _contents(files)
    keks = {k: base64.b64decode(v) for k, v in json.loads(key_file.read_text())["keys"].items()}
    deks: list[bytes] = []
    for blob in blobs:
        for run in set(_RUN.findall(blob)):
            for start in range(len(run) - 79):  # every 80-character window of the run
                raw = base64.b64decode(run[start : start + 80])
                for kek_id, kek in keks.items():
                    try:
                        deks.append(
                            AESGCM(kek).decrypt(raw[:12], raw[12:], b"statekeep-kek|" + kek_id.encode())
                        )
                    except InvalidTag:
                        continue
    texts = [b.decode("utf-8", "replace") for b in blobs]
    for blob in blobs:
        for dek_id, body in set(_TOKEN.findall(blob)):
            texts.extend(_open_token(dek_id, body, deks, owners))
    return {m for m in markers if any(m in t for t in texts)}


def _open_token(dek_id: bytes, body: bytes, deks: list[bytes], owners: Iterable[str]) -> list[str]:
    """Open a token whose body may run on into the next column's bytes: try each 4-aligned end."""
    for end in range(len(body) - len(body) % 4, max(len(body) - 64, 0), -4):
        try:
            sealed = base64.b64decode(body[:end], validate=True)
        except ValueError:
            continue
        if len(sealed) < 28:  # a nonce and a tag at least
            continue
        for dek in deks:
            for owner in owners:
                try:
                    aad = b"sk1|" + dek_id + b"|" + owner.encode()
                    return [AESGCM(dek).decrypt(sealed[:12], sealed[12:], aad).decode()]
                except InvalidTag:
                    continue
    return []
