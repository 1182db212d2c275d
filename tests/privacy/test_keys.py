"""Encryption at rest: key ids on sealed values, the key file, rotation and re-encryption, on each backend."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
import sqlalchemy as sa

from statekeep.config import Settings
from statekeep.context import Message, SQLContextStore
from statekeep.db import Database
from statekeep.errors import ConfigError, SealedDataError
from statekeep.keys import KeyRing, LocalKeyFile, is_sealed, key_id_of, open_key_ring, reencrypt
from statekeep.workflow import Engine, Registry, RunContext, SQLWorkflowStore
from statekeep.workflow.tables import runs
from statekeep.working import SQLWorkingStateStore, WorkingState


class Notes(WorkingState):
    text: str = ""


def _ring(url: str, tmp_path: Path) -> KeyRing:
    return KeyRing(url, LocalKeyFile(tmp_path / "keys.json"))


def test_seal_and_open_round_trip_with_the_key_id_in_the_token(database_url: str, tmp_path: Path) -> None:
    """A token names its data key; plain text passes through; a changed token is refused."""
    ring = _ring(database_url, tmp_path)
    token = ring.seal("alice", "Alice's secret 🙂")
    assert is_sealed(token)
    assert "secret" not in token
    assert ring.open(token) == "Alice's secret 🙂"
    assert ring.open('{"plain": "json"}') == '{"plain": "json"}'
    assert ring.seal("alice", "x") != ring.seal("alice", "x")  # a fresh nonce each time
    assert key_id_of(token) == key_id_of(ring.seal("alice", "again"))
    assert key_id_of(token) != key_id_of(ring.seal("bob", "bob's"))
    flipped = token[:-6] + ("A" if token[-6] != "A" else "B") + token[-5:]
    with pytest.raises(SealedDataError, match="altered"):
        ring.open(flipped)
    ring.db.dispose()


def test_the_key_file_is_private_and_refused_when_others_can_read_it(tmp_path: Path) -> None:
    """Created 0600 on first use; a group- or world-readable file is a ConfigError."""
    keys = LocalKeyFile(tmp_path / "home" / "keys.json")
    current = keys.current_id()
    assert (tmp_path / "home" / "keys.json").stat().st_mode & 0o777 == 0o600
    assert json.loads((tmp_path / "home" / "keys.json").read_text())["current"] == current
    os.chmod(tmp_path / "home" / "keys.json", 0o644)
    with pytest.raises(ConfigError, match="chmod 600"):
        LocalKeyFile(tmp_path / "home" / "keys.json").current_id()


def test_another_key_file_cannot_open_what_this_one_sealed(database_url: str, tmp_path: Path) -> None:
    """Every process needs the same key file: another one's keys unwrap nothing, and say why."""
    ring = _ring(database_url, tmp_path)
    token = ring.seal("alice", "secret")
    other = KeyRing(database_url, LocalKeyFile(tmp_path / "other" / "keys.json"))
    with pytest.raises(SealedDataError, match="same key file"):
        other.open(token)
    ring.db.dispose()
    other.db.dispose()


def test_rotation_keeps_old_rows_readable_and_reencrypt_moves_them_to_the_new_keys(
    database_url: str, tmp_path: Path
) -> None:
    """rotate(): a new key-encryption key and data keys for new writes; reencrypt re-seals and drops."""
    db = Database(database_url)
    ring = KeyRing(db, LocalKeyFile(tmp_path / "keys.json"), current_ttl=0.0)
    context = SQLContextStore(db, keys=ring)
    working = SQLWorkingStateStore(db, keys=ring)
    context.append("s1", Message.user("before rotation"), owner="alice")
    working.save("r1", Notes(text="state before"), owner="alice")
    old_kek = ring.provider.current_id()
    old_dek = key_id_of(_stored_payload(db, "s1", 1))

    new_kek = ring.rotate()
    assert new_kek is not None
    assert new_kek != old_kek
    context.append("s1", Message.user("after rotation"), owner="alice")
    new_dek = key_id_of(_stored_payload(db, "s1", 2))
    assert new_dek != old_dek
    assert [e.message.content for e in context.events("s1")] == ["before rotation", "after rotation"]
    assert ring.retired() == {old_dek}

    report = reencrypt(ring, {"context": db, "working": db, "workflow": db})
    assert report["context.resealed"] == 1
    assert report["working.resealed"] == 1
    assert report["data_keys.rewrapped"] == 0  # the retired key is dropped, the new one is wrapped anew
    assert report["data_keys.dropped"] == 1
    assert key_id_of(_stored_payload(db, "s1", 1)) == new_dek
    ring.forget_cache()
    assert [e.message.content for e in context.events("s1")] == ["before rotation", "after rotation"]
    assert working.load("r1", Notes).text == "state before"
    assert ring.retired() == set()
    assert isinstance(ring.provider, LocalKeyFile)
    ring.provider.retire(old_kek)  # nothing is wrapped under it any more
    ring.forget_cache()
    assert context.events("s1")[0].message.content == "before rotation"
    db.dispose()


def test_rewrap_moves_data_keys_to_the_current_key_encryption_key(database_url: str, tmp_path: Path) -> None:
    """A key-encryption-key rotation alone (data keys kept): rewrap, then the old key can go."""
    ring = _ring(database_url, tmp_path)
    token = ring.seal("alice", "kept")
    assert isinstance(ring.provider, LocalKeyFile)
    old = ring.provider.current_id()
    ring.provider.rotate()
    assert ring.rewrap() == 1
    ring.provider.retire(old)
    ring.forget_cache()
    assert ring.open(token) == "kept"
    with pytest.raises(ConfigError, match="current key"):
        ring.provider.retire(ring.provider.current_id())
    ring.db.dispose()


def _stored_payload(db: Database, session_id: str, seq: int) -> str:
    table = "context_events" if db.name == "sqlite" else "statekeep_context.context_events"
    with db.read() as conn:
        return str(
            conn.execute(
                sa.text(f"SELECT payload FROM {table} WHERE session_id = :s AND seq = :q"),
                {"s": session_id, "q": seq},
            ).scalar_one()
        )


def test_workflow_payloads_are_sealed_and_a_store_without_keys_says_so(
    database_url: str, tmp_path: Path
) -> None:
    """Run input, output and step outputs are sealed for an owned run; a keyless store refuses, clearly."""
    db = Database(database_url)
    ring = KeyRing(db, LocalKeyFile(tmp_path / "keys.json"))
    registry = Registry()

    @registry.workflow("greet", owner="who")
    def greet(ctx: RunContext, who: str, text: str) -> str:
        return str(ctx.step("shout", str.upper, text))

    @registry.workflow("anon")
    def anon(ctx: RunContext, text: str) -> str:
        return text

    engine = Engine(SQLWorkflowStore(db, keys=ring), registry)
    run = engine.run(greet, "g1", "alice", "hello alice")
    assert (run.owner, run.output) == ("alice", "HELLO ALICE")
    plain = engine.run(anon, "a1", "nobody's")
    assert plain.owner is None
    with db.read() as conn:
        stored = dict(conn.execute(sa.select(runs.c.run_id, runs.c.input)).all())
    assert is_sealed(stored["g1"])
    assert stored["a1"] == '{"args":["nobody\'s"],"kwargs":{}}'
    with pytest.raises(SealedDataError, match="no key ring"):
        SQLWorkflowStore(db).get("g1")
    assert SQLWorkflowStore(db).get("a1").output == "nobody's"
    db.dispose()


def test_text_search_finds_sealed_runs_by_their_input(database_url: str, tmp_path: Path) -> None:
    """The console's text filter matches what a person sees: the decrypted input and error, not ciphertext."""
    db = Database(database_url)
    registry = Registry()

    @registry.workflow("greet", owner="who")
    def greet(ctx: RunContext, who: str, text: str) -> str:
        return text

    store = SQLWorkflowStore(db, keys=KeyRing(db, LocalKeyFile(tmp_path / "keys.json")))
    engine = Engine(store, registry)
    engine.run(greet, "g1", "alice", "refund order 4711")
    engine.run(greet, "g2", "bob", "weather in Oslo")
    assert [r.run_id for r in store.search_runs(text="ORDER 4711").runs] == ["g1"]
    assert [r.run_id for r in store.search_runs(text="oslo", owner="bob").runs] == ["g2"]
    assert store.search_runs(text="oslo", owner="alice").total == 0
    assert [r.run_id for r in store.search_runs(text="g2").runs] == ["g2"]  # ids still match
    db.dispose()


def test_settings_choose_the_key_provider(tmp_path: Path) -> None:
    """local (default, <home>/keys.json), none, or module:callable returning a KeyProvider."""
    url = f"sqlite:///{tmp_path / 'db.sqlite'}"
    default = Settings.load(home=tmp_path / "h", database_url=url, env={})
    ring = open_key_ring(default)
    assert ring is not None
    assert Path(default.key_file) == tmp_path / "h" / "keys.json"
    ring.db.dispose()
    assert (
        open_key_ring(Settings.load(home=tmp_path / "h", database_url=url, env={"STATEKEEP_KEYS": "none"}))
        is None
    )
    custom = Settings.load(home=tmp_path / "h", database_url=url, keys=f"{__name__}:kms_provider", env={})
    ring = open_key_ring(custom)
    assert ring is not None
    assert isinstance(ring.provider, FakeKms)
    assert ring.open(ring.seal("alice", "via kms")) == "via kms"
    ring.db.dispose()
    with pytest.raises(ConfigError, match="STATEKEEP_KEYS"):
        Settings.load(home=tmp_path / "h", database_url=url, keys="vault", env={})


class FakeKms:
    """A stand-in KMS: wraps with a key it never hands out (here, a LocalKeyFile behind the interface)."""

    def __init__(self, path: Path) -> None:
        self._inner = LocalKeyFile(path)

    def current_id(self) -> str:
        return "kms-" + self._inner.current_id()

    def wrap(self, key_id: str, dek: bytes) -> bytes:
        return self._inner.wrap(key_id.removeprefix("kms-"), dek)

    def unwrap(self, key_id: str, blob: bytes) -> bytes:
        return self._inner.unwrap(key_id.removeprefix("kms-"), blob)


def kms_provider(settings: Settings) -> FakeKms:
    return FakeKms(settings.home / "kms.json")
