"""Keys: per-owner data keys that seal payloads at rest, and the providers of the keys that wrap them.

Shared infrastructure, like :mod:`statekeep.db`: the SQL stores take an optional
:class:`KeyRing` (``keys=``) and seal the payload columns no index needs with
the data key of the payload's owner; erasure shreds that key. See docs/privacy.md.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING

from statekeep.errors import ConfigError
from statekeep.keys.provider import KeyProvider, LocalKeyFile
from statekeep.keys.reseal import reencrypt
from statekeep.keys.ring import STORE, KeyRing, ShredReport, is_sealed, key_id_of, no_key_ring

if TYPE_CHECKING:
    from statekeep.config import Settings
    from statekeep.db import Database


def provider_for(settings: Settings) -> KeyProvider | None:
    """The key provider the settings name: the local key file, a factory's (a KMS), or None (``none``).

    Raises:
        ConfigError: the factory cannot be loaded, or does not return a KeyProvider.
    """
    if settings.keys == "none":
        return None
    if settings.keys == "local":
        return LocalKeyFile(settings.key_file or settings.home / "keys.json")
    module, _, attr = settings.keys.partition(":")
    try:
        factory = getattr(importlib.import_module(module), attr)
        provider = factory(settings)
    except Exception as exc:  # the application's factory failed: say which setting
        raise ConfigError("STATEKEEP_KEYS", settings.keys, f"cannot build the key provider: {exc!r}") from exc
    if not isinstance(provider, KeyProvider):
        raise ConfigError("STATEKEEP_KEYS", settings.keys, "the factory did not return a KeyProvider")
    return provider


def open_key_ring(settings: Settings, db: Database | str | None = None) -> KeyRing | None:
    """The key ring of these settings, its keys in ``db`` (default: the database it declares, the workflow's).

    None when ``STATEKEEP_KEYS=none``.
    """
    provider = provider_for(settings)
    if provider is None:
        return None
    assert STORE.lives_in is not None
    return KeyRing(db if db is not None else settings.url_for(STORE.lives_in), provider)


__all__ = [
    "KeyProvider",
    "KeyRing",
    "LocalKeyFile",
    "ShredReport",
    "is_sealed",
    "key_id_of",
    "no_key_ring",
    "open_key_ring",
    "provider_for",
    "reencrypt",
]
