"""Settings: one URL per store, from arguments or ``STATEKEEP_*`` environment variables.

=============================  ==========================================  ==============================
setting                        used by                                     default
=============================  ==========================================  ==============================
``STATEKEEP_HOME``             where embedded data lives                   ``.statekeep``
``STATEKEEP_DATABASE_URL``     context, working state, workflow (SQL)      ``sqlite:///<home>/statekeep.db``
``STATEKEEP_MEMORY_URL``       long-term memory                            ``<home>/memory`` (LanceDB)
``STATEKEEP_KEYS``             who holds the key-encryption keys           ``local`` (the key file)
``STATEKEEP_KEY_FILE``         the local key file                          ``<home>/keys.json``
=============================  ==========================================  ==============================

Each SQL store may also be pointed elsewhere (``context_url``, ``working_url``,
``workflow_url``; env ``STATEKEEP_CONTEXT_URL`` and so on); they default to the
database URL. The memory URL is a folder path or ``lancedb://path`` for LanceDB,
or a ``postgresql://`` URL for pgvector.

``STATEKEEP_KEYS`` is ``local`` (payloads sealed with per-owner data keys, wrapped
by the keys of the local key file), ``none`` (no encryption at rest), or
``module:callable``, a factory given the settings that returns a
:class:`~statekeep.keys.KeyProvider` (a KMS). See docs/privacy.md.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from statekeep.db.engine import Database, normalize_url
from statekeep.errors import ConfigError

SQL_STORES = ("context", "working", "workflow")


@dataclass(frozen=True)
class MemoryURL:
    """A parsed memory URL: a LanceDB folder or a PostgreSQL database."""

    backend: str  # "lancedb" or "pgvector"
    location: str  # folder path, or SQLAlchemy URL


@dataclass(frozen=True)
class Settings:
    """Where each store keeps its data. Build with :meth:`load`.

    Examples:
        >>> s = Settings.load(home="/tmp/agent")
        >>> s.database_url
        'sqlite:////tmp/agent/statekeep.db'
    """

    home: Path
    database_url: str
    memory_url: str
    store_urls: Mapping[str, str] = field(default_factory=dict)
    #: ``local``, ``none`` or ``module:callable`` (see the module docstring)
    keys: str = "local"
    #: the local key file (``keys="local"``); empty means ``<home>/keys.json``
    key_file: str = ""

    @classmethod
    def load(
        cls,
        *,
        home: str | Path | None = None,
        database_url: str | None = None,
        memory_url: str | None = None,
        env: Mapping[str, str] | None = None,
        keys: str | None = None,
        key_file: str | Path | None = None,
        **store_urls: str | None,
    ) -> Settings:
        """Read settings from arguments, then the environment, then defaults.

        Raises:
            ConfigError: a URL is malformed; the error names the setting.
        """
        env = os.environ if env is None else env
        if not isinstance(env, Mapping):
            raise ConfigError("env", repr(env), "must be a mapping of environment variables")
        _check_folder(env.get("STATEKEEP_HOME"), "STATEKEEP_HOME")
        _check_folder(home, "home")
        unknown = set(store_urls) - {f"{s}_url" for s in SQL_STORES}
        if unknown:
            raise ConfigError(sorted(unknown)[0], "", f"unknown setting; per-store URLs are {SQL_STORES}")
        for name, value in {"database_url": database_url, "memory_url": memory_url, **store_urls}.items():
            if value is not None and not isinstance(value, str):
                raise ConfigError(name, repr(value), f"must be a URL string, not {type(value).__name__}")
        root = Path(home or env.get("STATEKEEP_HOME") or ".statekeep")
        if "\x00" in str(root):
            raise ConfigError("STATEKEEP_HOME", str(root), "contains a NUL character")
        db_url = database_url or env.get("STATEKEEP_DATABASE_URL") or f"sqlite:///{root}/statekeep.db"
        normalize_url(db_url, setting="STATEKEEP_DATABASE_URL")
        urls = {}
        for store in SQL_STORES:
            setting = f"STATEKEEP_{store.upper()}_URL"
            url = store_urls.get(f"{store}_url") or env.get(setting) or db_url
            normalize_url(url, setting=setting)
            urls[store] = url
        mem = memory_url or env.get("STATEKEEP_MEMORY_URL") or str(root / "memory")
        parse_memory_url(mem)
        provider = keys or env.get("STATEKEEP_KEYS") or "local"
        _check_keys(provider)
        _check_folder(key_file, "key_file")
        path = str(key_file or env.get("STATEKEEP_KEY_FILE") or root / "keys.json")
        return cls(
            home=root, database_url=db_url, memory_url=mem, store_urls=urls, keys=provider, key_file=path
        )

    def url_for(self, store: str) -> str:
        """The SQL URL of one store (``context``, ``working`` or ``workflow``).

        Raises:
            ConfigError: ``store`` is not one of those three.
        """
        if store not in SQL_STORES:
            raise ConfigError("store", repr(store), f"must be one of {SQL_STORES}")
        return self.store_urls.get(store, self.database_url)

    @property
    def memory(self) -> MemoryURL:
        """The parsed memory URL."""
        return parse_memory_url(self.memory_url)

    def check(self) -> None:
        """Reach every configured server once; fail with the setting's name if one is down.

        Raises:
            ConfigError: a database cannot be reached or a folder cannot be created.
        """
        seen: set[str] = set()
        for store in SQL_STORES:
            url = self.url_for(store)
            if url in seen:
                continue
            seen.add(url)
            setting = (
                "STATEKEEP_DATABASE_URL" if url == self.database_url else f"STATEKEEP_{store.upper()}_URL"
            )
            db = Database(url, setting=setting)
            try:
                db.check()
            finally:
                db.dispose()
        memory = self.memory
        if memory.backend == "pgvector":
            db = Database(memory.location, setting="STATEKEEP_MEMORY_URL")
            try:
                db.check()
            finally:
                db.dispose()
        else:
            _ensure_folder(Path(memory.location), "STATEKEEP_MEMORY_URL")


def parse_memory_url(url: str) -> MemoryURL:
    """Parse ``STATEKEEP_MEMORY_URL``: a folder, ``lancedb://folder`` or a PostgreSQL URL.

    Raises:
        ConfigError: naming ``STATEKEEP_MEMORY_URL``.
    """
    setting = "STATEKEEP_MEMORY_URL"
    if not isinstance(url, str):
        raise ConfigError(setting, repr(url), f"must be a folder or URL string, not {type(url).__name__}")
    if not url or not url.strip():
        raise ConfigError(setting, url, "empty")
    if "\x00" in url:
        raise ConfigError(setting, url, "contains a NUL character")
    if url.startswith(("postgresql", "postgres:")):
        return MemoryURL("pgvector", normalize_url(url, setting=setting).render_as_string(False))
    if url.startswith("lancedb://"):
        url = url.removeprefix("lancedb://")
        if not url:
            raise ConfigError(setting, "lancedb://", "a LanceDB URL needs a folder path")
        return MemoryURL("lancedb", url)
    if "://" in url:
        raise ConfigError(setting, url, "use a folder path, lancedb://folder, or postgresql://...")
    return MemoryURL("lancedb", url)


def _check_keys(value: object) -> None:
    if not isinstance(value, str) or not (
        value in ("local", "none") or (value.count(":") == 1 and all(value.split(":")))
    ):
        raise ConfigError("STATEKEEP_KEYS", str(value), "must be local, none, or module:callable")


def _check_folder(value: object, setting: str) -> None:
    """None, or a folder path (a string or a PathLike); URLs in the environment are checked when parsed."""
    if value is not None and not isinstance(value, str | os.PathLike):
        raise ConfigError(setting, repr(value), f"must be a folder path, not {type(value).__name__}")


def _ensure_folder(path: Path, setting: str) -> None:
    try:
        path.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise ConfigError(setting, str(path), f"cannot create folder: {exc.strerror}") from exc
