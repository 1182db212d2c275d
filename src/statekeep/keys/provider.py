"""Key-encryption keys (KEKs): the small interface a key store implements, and the local key file.

A :class:`KeyProvider` holds key-encryption keys and never hands them out: it
wraps (encrypts) and unwraps data keys under a key named by its id. The
embedded default is :class:`LocalKeyFile`, a JSON file readable by its owner
only; a KMS (AWS KMS, Google Cloud KMS, HashiCorp Vault transit...) plugs in
by implementing the same three methods (see docs/privacy.md).
"""

from __future__ import annotations

import base64
import contextlib
import json
import os
import secrets
import stat
import sys
import threading
from datetime import UTC, datetime
from pathlib import Path
from typing import Protocol, runtime_checkable

from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives.ciphers.aead import AESGCM

from statekeep.errors import ConfigError, SealedDataError

NONCE = 12  # 96-bit nonces, as AES-GCM is specified for


@runtime_checkable
class KeyProvider(Protocol):
    """Where key-encryption keys live: wraps and unwraps data keys, never reveals its own keys.

    ``current_id`` names the key new data keys are wrapped under; a rotation
    changes it, while older ids must still unwrap what they wrapped until every
    data key has been re-wrapped (:meth:`KeyRing.rewrap <statekeep.keys.KeyRing.rewrap>`).
    """

    def current_id(self) -> str:
        """The id of the key that wraps new data keys."""
        ...

    def wrap(self, key_id: str, dek: bytes) -> bytes:
        """``dek`` encrypted under the key ``key_id``."""
        ...

    def unwrap(self, key_id: str, blob: bytes) -> bytes:
        """The data key that :meth:`wrap` turned into ``blob``.

        Raises:
            SealedDataError: this provider has no key ``key_id``, or ``blob`` was altered.
        """
        ...


def _aad(key_id: str) -> bytes:
    return b"statekeep-kek|" + key_id.encode()


class LocalKeyFile:
    """Key-encryption keys in a local JSON file, created ``0600`` on first use.

    The embedded default (``<STATEKEEP_HOME>/keys.json``). Every process that reads
    the stores needs the same file: mount it as a secret on each worker, or use a
    KMS provider instead. A file that other users may read is refused.

    Examples:
        >>> import tempfile, pathlib
        >>> keys = LocalKeyFile(pathlib.Path(tempfile.mkdtemp()) / "keys.json")
        >>> blob = keys.wrap(keys.current_id(), b"k" * 32)
        >>> keys.unwrap(keys.current_id(), blob) == b"k" * 32
        True
    """

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = Path(path)
        self._lock = threading.Lock()
        self._keys: dict[str, bytes] = {}
        self._current = ""
        self._stamp: tuple[int, int] | None = None

    # --- KeyProvider -----------------------------------------------------------------------

    def current_id(self) -> str:
        self._load()
        return self._current

    def wrap(self, key_id: str, dek: bytes) -> bytes:
        nonce = os.urandom(NONCE)
        return nonce + AESGCM(self._key(key_id)).encrypt(nonce, dek, _aad(key_id))

    def unwrap(self, key_id: str, blob: bytes) -> bytes:
        try:
            return AESGCM(self._key(key_id)).decrypt(blob[:NONCE], blob[NONCE:], _aad(key_id))
        except InvalidTag:
            raise SealedDataError(key_id, "the wrapped data key does not open under this key") from None

    # --- rotation --------------------------------------------------------------------------

    def rotate(self) -> str:
        """Add a new key and make it current; older keys stay, to unwrap what they wrapped."""
        with self._lock:
            keys, _ = self._read()
            new = f"kek-{datetime.now(UTC):%Y%m%d}-{secrets.token_hex(4)}"
            keys[new] = AESGCM.generate_key(bit_length=256)
            self._write(keys, new, replace=True)
            self._stamp = None
        return new

    def retire(self, key_id: str) -> None:
        """Remove an old key (after :meth:`KeyRing.rewrap`); the current key cannot be retired.

        Raises:
            ConfigError: ``key_id`` is the current key.
        """
        with self._lock:
            keys, current = self._read()
            if key_id == current:
                raise ConfigError("key file", str(self.path), f"{key_id!r} is the current key; rotate first")
            keys.pop(key_id, None)
            self._write(keys, current, replace=True)
            self._stamp = None

    def key_ids(self) -> list[str]:
        """Every key id in the file, the current one last."""
        self._load()
        return [k for k in self._keys if k != self._current] + [self._current]

    # --- the file --------------------------------------------------------------------------

    def _key(self, key_id: str) -> bytes:
        self._load()
        key = self._keys.get(key_id)
        if key is None:
            self._load(force=True)  # rotated by another process since we read it?
            key = self._keys.get(key_id)
        if key is None:
            raise SealedDataError(
                key_id,
                f"the key file {self.path} has no such key-encryption key: every process needs the "
                "same key file (STATEKEEP_KEY_FILE), or a KMS provider",
            )
        return key

    def _load(self, *, force: bool = False) -> None:
        try:
            st = self.path.stat()
        except FileNotFoundError:
            self._create()
            st = self.path.stat()
        stamp = (st.st_mtime_ns, st.st_ino)
        if not force and stamp == self._stamp:
            return
        with self._lock:
            self._check_mode(st)
            self._keys, self._current = self._read()
            self._stamp = stamp

    def _check_mode(self, st: os.stat_result) -> None:
        if sys.platform != "win32" and stat.S_IMODE(st.st_mode) & 0o077:
            raise ConfigError(
                "STATEKEEP_KEY_FILE",
                str(self.path),
                f"other users may read it (mode {stat.S_IMODE(st.st_mode):o}); chmod 600 it",
            )

    def _read(self) -> tuple[dict[str, bytes], str]:
        try:
            data = json.loads(self.path.read_text())
            keys = {str(k): base64.b64decode(v) for k, v in data["keys"].items()}
            current = str(data["current"])
        except (OSError, ValueError, KeyError, TypeError, AttributeError) as exc:
            reason = f"not a statekeep key file: {exc}"
            raise ConfigError("STATEKEEP_KEY_FILE", str(self.path), reason) from exc
        if current not in keys or any(len(k) != 32 for k in keys.values()):
            raise ConfigError("STATEKEEP_KEY_FILE", str(self.path), "not a statekeep key file")
        return keys, current

    def _create(self) -> None:
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise ConfigError("STATEKEEP_KEY_FILE", str(self.path), f"cannot create: {exc.strerror}") from exc
        first = f"kek-{datetime.now(UTC):%Y%m%d}-{secrets.token_hex(4)}"
        self._write({first: AESGCM.generate_key(bit_length=256)}, first, replace=False)

    def _write(self, keys: dict[str, bytes], current: str, *, replace: bool) -> None:
        """Write to a private temporary file, then link or rename it into place (atomic either way)."""
        data = {
            "format": "statekeep-keys/1",
            "current": current,
            "keys": {k: base64.b64encode(v).decode() for k, v in keys.items()},
        }
        tmp = self.path.with_name(f".{self.path.name}.{secrets.token_hex(6)}")
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        try:
            with os.fdopen(fd, "w") as f:
                json.dump(data, f, indent=1)
                f.flush()
                os.fsync(f.fileno())
            if replace:
                os.replace(tmp, self.path)
            else:
                with contextlib.suppress(FileExistsError):  # another process created it first: theirs wins
                    os.link(tmp, self.path)
        finally:
            tmp.unlink(missing_ok=True)
