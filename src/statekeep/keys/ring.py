"""Per-owner data keys: seal and open payloads, shred an owner's keys (crypto-shredding).

Each owner gets a random 256-bit data key (DEK). Payload columns that no index
needs are stored as self-describing tokens::

    sk1:<dek id>:<base64(nonce | ciphertext | tag)>

sealed with AES-GCM (``cryptography``), a random 96-bit nonce, and associated
data that binds the token to its key id and owner. Data keys are stored
wrapped by a key-encryption key of a :class:`~statekeep.keys.KeyProvider`, with
that key's id, in ``statekeep_keys.data_keys``. Erasure deletes the owner's rows
and then :meth:`KeyRing.shred` deletes the owner's data keys, so whatever bytes
of the owner remain (a PostgreSQL dead tuple, a backup) cannot be decrypted.

The wrapped keys themselves must not outlive the shredding: on PostgreSQL the
table is hash-partitioned by owner and shredding rewrites the owner's partition
(``VACUUM FULL`` of a few kilobytes per thousand owners); on SQLite
``secure_delete`` zeroes the deleted row and erasure truncates the WAL.

Opening is cheap: one AES-GCM operation, with data keys cached in the process
(bounded); an owner's current key is looked up once per ``current_ttl`` seconds.
Plain text (rows written before encryption, or by a store without a key ring)
passes :meth:`KeyRing.open` unchanged.
"""

from __future__ import annotations

import binascii
import os
import re
import secrets
import threading
import time
from collections import OrderedDict
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

import sqlalchemy as sa
from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives.ciphers.aead import AESGCM
from sqlalchemy.engine import Connection

from statekeep.db import Database, Migration
from statekeep.db.catalog import Erased, Erasing, StoreSpec
from statekeep.db.dialects import hooks, no_statistics
from statekeep.db.rewrite import MARK, rewrite
from statekeep.db.types import UTCDateTime
from statekeep.errors import InvalidInputError, SealedDataError
from statekeep.keys.provider import NONCE, KeyProvider

SCHEMA = "statekeep_keys"
#: Hash partitions of the data-key table on PostgreSQL: shredding rewrites one of them.
PARTITIONS = 32
PREFIX = "sk1:"
#: a token's head: the prefix and the 20-hex-digit data-key id (checked without scanning the body)
_HEAD = re.compile(r"sk1:[0-9a-f]{20}:")
_HEAD_LEN = 25

metadata = sa.MetaData(schema=SCHEMA)
data_keys = sa.Table(
    "data_keys",
    metadata,
    sa.Column("owner", sa.String(255), primary_key=True),
    sa.Column("dek_id", sa.String(32), primary_key=True),
    sa.Column("kek_id", sa.String(255), nullable=False),
    # base64 of the provider's wrapped key
    sa.Column("wrapped", sa.Text, nullable=False),
    sa.Column("created_at", UTCDateTime, nullable=False),
    # NULL: the owner's current key (at most one); set: retired by a rotation, still opens old rows
    sa.Column("retired_at", UTCDateTime, nullable=True),
    sa.Index("data_keys_dek_id", "dek_id"),
    sa.Index(
        "data_keys_current",
        "owner",
        unique=True,
        postgresql_where=sa.text("retired_at IS NULL"),
        sqlite_where=sa.text("retired_at IS NULL"),
    ),
    postgresql_partition_by="HASH (owner)",
)


#: Owners, key ids and wrapped keys are never sampled into pg_statistic (erasure does not rewrite
#: it), in the table and in each of its partitions (PostgreSQL).
NO_STATISTICS = dict.fromkeys(
    ("data_keys", *(f"data_keys_p{i}" for i in range(PARTITIONS))), ("owner", "dek_id", "wrapped")
)


def _create(conn: Connection) -> None:
    metadata.create_all(conn, tables=[data_keys])
    hooks(conn.dialect).hash_partitions(conn, SCHEMA, data_keys.name, PARTITIONS)
    no_statistics(conn, SCHEMA, NO_STATISTICS)


MIGRATIONS = [Migration(1, "data_keys: per-owner data keys, wrapped, partitioned by owner", _create)]


def _erase(ring: KeyRing | None, erasing: Erasing) -> Erased | None:
    """The owner's data keys, last: whatever sealed bytes of theirs remain can no longer be opened."""
    if ring is None:
        return None
    shredded = ring.shred(erasing.owner)
    return Erased({"data_keys": shredded.keys}, shredded.locations)


STORE: StoreSpec[KeyRing] = StoreSpec(
    "keys",
    metadata,
    MIGRATIONS,
    lives_in="workflow",
    no_statistics=NO_STATISTICS,
    erase=_erase,
    enabled=lambda settings: settings.keys != "none",
)


def setup(db: Database) -> None:
    """Create or upgrade the key tables (idempotent)."""
    STORE.upgrade(db)


def is_sealed(value: str) -> bool:
    """True for a token :meth:`KeyRing.seal` made (JSON text never starts like one)."""
    return value.startswith(PREFIX) and len(value) > _HEAD_LEN and _HEAD.match(value) is not None


def key_id_of(value: str) -> str | None:
    """The data-key id of a sealed token, None for plain text."""
    return value[4:24] if is_sealed(value) else None


def no_key_ring(token: str, store: str, whose: str) -> SealedDataError:
    """The error for a sealed ``token`` of ``whose`` (a run, a session) read by a ``store`` without keys.

    It names the data key, whose values are sealed, and how to open the store.
    """
    return SealedDataError(
        str(key_id_of(token)),
        f"{whose} holds values sealed with its owner's data key, and this {store} store has no key ring:"
        " open it with keys=open_key_ring(Settings.load()) (from statekeep.keys), as the CLI and the"
        " Runtime do; for a hand-built engine, Engine(url, registry, keys=...)",
    )


@dataclass(frozen=True, slots=True)
class _Key:
    dek_id: str
    owner: str
    aead: AESGCM
    aad: bytes


@dataclass(frozen=True, slots=True)
class ShredReport:
    """What :meth:`KeyRing.shred` did: how many data keys, and which storage it rewrote."""

    keys: int
    locations: tuple[str, ...]


def _b64(data: bytes) -> str:
    return binascii.b2a_base64(data, newline=False).decode()


def _unb64(text: str) -> bytes:
    return binascii.a2b_base64(text)


class KeyRing:
    """The per-owner data keys of a database, wrapped by a :class:`KeyProvider`.

    Share one key ring between the stores of a process (the runtime does): keys
    live in the database given here (by default the workflow store's).

    Args:
        db: the database of the ``statekeep_keys`` schema (a URL or a shared :class:`Database`).
        provider: holds the key-encryption keys (default embedded: :class:`LocalKeyFile`).
        cache_size: data keys kept unwrapped in this process.
        current_ttl: seconds an owner's current key is used without looking it up again
            (after a rotation elsewhere, new writes move to the new key within this time).

    Examples:
        >>> import tempfile, pathlib
        >>> from statekeep.keys import LocalKeyFile
        >>> home = pathlib.Path(tempfile.mkdtemp())
        >>> ring = KeyRing(f"sqlite:///{home}/k.db", LocalKeyFile(home / "keys.json"))
        >>> token = ring.seal("alice", "my secret")
        >>> token.startswith("sk1:") and "secret" not in token
        True
        >>> ring.open(token)
        'my secret'
    """

    def __init__(
        self,
        db: Database | str,
        provider: KeyProvider,
        *,
        cache_size: int = 10_000,
        current_ttl: float = 60.0,
    ) -> None:
        if not isinstance(provider, KeyProvider):
            raise InvalidInputError("must implement current_id, wrap and unwrap", field="provider")
        self.db = db if isinstance(db, Database) else Database(db, setting="STATEKEEP_WORKFLOW_URL")
        self.provider = provider
        self.cache_size = cache_size
        self.current_ttl = current_ttl
        self._lock = threading.Lock()
        self._by_id: OrderedDict[str, _Key] = OrderedDict()
        self._current: dict[str, tuple[_Key, float]] = {}
        setup(self.db)

    # --- sealing ---------------------------------------------------------------------------

    def seal(self, owner: str, text: str, *, create: bool = True) -> str:
        """``text`` encrypted under ``owner``'s current data key, as a ``sk1:`` token.

        ``create=False`` inside another write transaction of the same SQLite database:
        the owner's key must exist already (see :meth:`prepare`), since creating it
        would wait for that transaction's lock.

        Raises:
            SealedDataError: ``create`` is False and the owner has no data key yet.
        """
        key = self._current_key(owner, create)
        nonce = os.urandom(NONCE)
        return f"{PREFIX}{key.dek_id}:{_b64(nonce + key.aead.encrypt(nonce, text.encode(), key.aad))}"

    def prepare(self, owner: str) -> None:
        """Make sure ``owner`` has a current data key, cached here (call before a write transaction)."""
        self._current_key(owner, True)

    def ready(self, owner: str) -> bool:
        """True when ``owner``'s current key is cached (sealing needs no query)."""
        hit = self._current.get(owner)
        return hit is not None and hit[1] > time.monotonic()

    def open(self, value: str) -> str:
        """The plain text of a sealed token; plain text is returned unchanged.

        Raises:
            SealedDataError: the token's data key was shredded (its owner erased), its
                key-encryption key is unknown to the provider, or the token was altered.
        """
        if not value.startswith(PREFIX) or not is_sealed(value):
            return value
        key = self._key(value[4:24])
        try:
            blob = _unb64(value[_HEAD_LEN:])
            return key.aead.decrypt(blob[:NONCE], blob[NONCE:], key.aad).decode()
        except (InvalidTag, binascii.Error, ValueError):
            raise SealedDataError(
                key.dek_id, "the sealed value was altered (it does not authenticate)"
            ) from None

    def open_optional(self, value: str | None) -> str | None:
        """:meth:`open`, passing None through."""
        return None if value is None else self.open(value)

    # --- erasure and rotation --------------------------------------------------------------

    def shred(self, owner: str) -> ShredReport:
        """Delete every data key of ``owner``: their sealed values can never be opened again.

        On PostgreSQL the owner's partition of the key table is then rewritten
        (``VACUUM FULL``), so no dead tuple keeps a wrapped key, once no transaction
        older than the delete remains (:func:`statekeep.db.rewrite.rewrite`); on SQLite the
        delete runs with ``secure_delete`` on, and the WAL is truncated.

        Raises:
            ErasureError: the keys were deleted but the partition could not be rewritten, or a
                transaction older than the delete still saw them; shred again.
        """
        with self.db.begin(f"shredding the data keys of {owner!r}") as conn:
            deleted = conn.execute(
                data_keys.delete().where(data_keys.c.owner == owner).returning(data_keys.c.dek_id)
            )
            ids = [r[0] for r in deleted]
            partition = self._partition_of(conn, owner)
            mark = conn.exec_driver_sql(MARK).scalar_one() if partition is not None else ""
        with self._lock:
            self._current.pop(owner, None)
            for dek_id in ids:
                self._by_id.pop(dek_id, None)
        locations = [f"{self.db.name}: {SCHEMA}.data_keys rows of the owner deleted"]
        if partition is not None:
            rewrite(self.db, [partition], mark=mark, owner=owner)
            locations.append(f"{partition}: rewritten (VACUUM FULL), no wrapped key left in a dead tuple")
        else:
            scrubbed = self.db.scrub(owner)
            locations.append(f"sqlite: deleted with secure_delete; {scrubbed}")
        return ShredReport(len(ids), tuple(locations))

    def rotate(self, *, data_keys_too: bool = True) -> str | None:
        """Rotate: a new key-encryption key (when the provider can make one), and new data keys.

        New writes use the new keys (in other processes within ``current_ttl``);
        old rows stay readable under their retired keys until :meth:`reencrypt
        <statekeep.keys.reencrypt>` seals them again. Returns the new key-encryption
        key's id, or None when the provider rotates its keys itself (a KMS).
        """
        rotate = getattr(self.provider, "rotate", None)
        new = rotate() if callable(rotate) else None
        if data_keys_too:
            with self.db.begin("retiring the current data keys") as conn:
                conn.execute(
                    data_keys.update().where(data_keys.c.retired_at.is_(None)).values(retired_at=_now())
                )
            with self._lock:
                self._current.clear()
        return new if isinstance(new, str) else None

    def rewrap(self) -> int:
        """Wrap every data key still under an older key-encryption key under the current one.

        Cheap (no payload is touched); afterwards the old key-encryption key can be
        retired from the provider. Returns how many keys were re-wrapped.
        """
        current = self.provider.current_id()
        q = sa.select(data_keys.c.owner, data_keys.c.dek_id, data_keys.c.kek_id, data_keys.c.wrapped).where(
            data_keys.c.kek_id != current
        )
        with self.db.read("listing data keys to re-wrap") as conn:
            rows = list(conn.execute(q))
        for owner, dek_id, kek_id, wrapped in rows:
            dek = self.provider.unwrap(kek_id, _unb64(wrapped))
            new = _b64(self.provider.wrap(current, dek))
            where = sa.and_(data_keys.c.owner == owner, data_keys.c.dek_id == dek_id)
            with self.db.begin("re-wrapping a data key") as conn:
                conn.execute(data_keys.update().where(where).values(kek_id=current, wrapped=new))
        return len(rows)

    def retired(self) -> set[str]:
        """Ids of every retired data key (rows sealed under them are re-sealed by ``reencrypt``)."""
        with self.db.read("listing retired data keys") as conn:
            q = sa.select(data_keys.c.dek_id).where(data_keys.c.retired_at.is_not(None))
            return {r[0] for r in conn.execute(q)}

    def drop_retired(self, started: datetime) -> int:
        """Delete the retired keys a re-encryption pass that began at ``started`` has made unused.

        Only keys retired at least two ``current_ttl`` before ``started``: no process
        could still be sealing new rows with them when the pass began.
        """
        cutoff = started - timedelta(seconds=2 * self.current_ttl)
        with self.db.begin("dropping retired data keys") as conn:
            retired = sa.and_(data_keys.c.retired_at.is_not(None), data_keys.c.retired_at <= cutoff)
            q = data_keys.delete().where(retired)
            ids = [r[0] for r in conn.execute(q.returning(data_keys.c.dek_id))]
        with self._lock:
            for dek_id in ids:
                self._by_id.pop(dek_id, None)
        return len(ids)

    def owner_of_key(self, dek_id: str) -> str:
        """The owner whose data key ``dek_id`` is.

        Raises:
            SealedDataError: no such key (shredded).
        """
        return self._key(dek_id).owner

    def forget_cache(self) -> None:
        """Drop every cached key (tests; a process that must not hold keys in memory any longer)."""
        with self._lock:
            self._current.clear()
            self._by_id.clear()

    # --- keys ------------------------------------------------------------------------------

    def _current_key(self, owner: str, create: bool) -> _Key:
        hit = self._current.get(owner)
        now = time.monotonic()
        if hit is not None and hit[1] > now:
            return hit[0]
        q = sa.select(data_keys.c.dek_id, data_keys.c.kek_id, data_keys.c.wrapped).where(
            data_keys.c.owner == owner, data_keys.c.retired_at.is_(None)
        )
        with self.db.read(f"reading the data key of {owner!r}") as conn:
            row = conn.execute(q).first()
        if row is None:
            if not create:
                raise SealedDataError("-", f"owner {owner!r} has no data key yet (prepare it first)")
            dek_id, kek_id, wrapped = self._create(owner, q)
        else:
            dek_id, kek_id, wrapped = row
        key = self._remember(owner, dek_id, kek_id, wrapped)
        with self._lock:
            self._current[owner] = (key, now + self.current_ttl)
        return key

    def _create(self, owner: str, q: sa.Select[Any]) -> tuple[str, str, str]:
        kek_id = self.provider.current_id()
        dek = AESGCM.generate_key(bit_length=256)
        values = {
            "owner": owner,
            "dek_id": secrets.token_hex(10),
            "kek_id": kek_id,
            "wrapped": _b64(self.provider.wrap(kek_id, dek)),
            "created_at": _now(),
        }
        insert = self.db.dialect.insert(data_keys).values(values)
        insert = insert.on_conflict_do_nothing(  # a concurrent creator won: use its key
            index_elements=["owner"], index_where=data_keys.c.retired_at.is_(None)
        )
        with self.db.begin(f"creating the data key of {owner!r}") as conn:
            conn.execute(insert)
            row = conn.execute(q).one()
        return str(row[0]), str(row[1]), str(row[2])

    def _key(self, dek_id: str) -> _Key:
        key = self._by_id.get(dek_id)
        if key is not None:
            return key
        q = sa.select(data_keys.c.owner, data_keys.c.kek_id, data_keys.c.wrapped).where(
            data_keys.c.dek_id == dek_id
        )
        with self.db.read("reading a data key") as conn:
            row = conn.execute(q).first()
        if row is None:
            raise SealedDataError(dek_id, "no such data key: it was shredded (its owner was erased)")
        return self._remember(row[0], dek_id, row[1], row[2])

    def _remember(self, owner: str, dek_id: str, kek_id: str, wrapped: str) -> _Key:
        with self._lock:
            key = self._by_id.get(dek_id)
            if key is not None:
                self._by_id.move_to_end(dek_id)
                return key
        dek = self.provider.unwrap(kek_id, _unb64(wrapped))
        key = _Key(dek_id, owner, AESGCM(dek), f"sk1|{dek_id}|{owner}".encode())
        with self._lock:
            self._by_id[dek_id] = key
            while len(self._by_id) > self.cache_size:
                self._by_id.popitem(last=False)
        return key

    def _partition_of(self, conn: Connection, owner: str) -> str | None:
        return self.db.dialect.partition_holding(conn, SCHEMA, data_keys.name, PARTITIONS, owner)


def _now() -> datetime:
    return datetime.now(UTC)
