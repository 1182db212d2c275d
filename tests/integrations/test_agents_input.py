"""The Agents SDK session checks what it is given, and seals what it stores with its owner's data key."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa

pytest.importorskip("agents", reason="the agents extra")

from statekeep.context import SQLContextStore
from statekeep.context.sql import events
from statekeep.errors import ConfigError, InvalidInputError, SealedDataError, SessionOwnerError
from statekeep.integrations._agents_items import items_table
from statekeep.integrations.agents import StatekeepSession
from statekeep.keys import KeyRing, LocalKeyFile

ITEM = {"role": "user", "content": "my PIN is 4711"}


def _rows(session: StatekeepSession) -> tuple[list[str], list[str]]:
    """The raw item column and the raw event payloads of the session, as the database holds them."""
    with session.db.read() as conn:
        items = conn.execute(
            sa.select(items_table.c.item).where(items_table.c.session_id == session.session_id)
        ).scalars()
        payloads = conn.execute(
            sa.select(events.c.payload).where(events.c.session_id == session.session_id)
        ).scalars()
        return [str(v) for v in items], [str(v) for v in payloads]


def test_add_items_needs_a_list_of_json_objects(database_url: str) -> None:
    """A string is not a list of items (no item per character); a bad item is named; nothing is stored."""
    store = SQLContextStore(database_url)
    session = StatekeepSession("v1", store)
    bad: list[tuple[Any, str]] = [
        ("hello", "items: must be a list of SDK items, not str"),
        ({"role": "user"}, "items: must be a list"),
        ([ITEM, object()], r"items\[1\]: must be an SDK item \(a dict\), not object"),
        ([{"role": "user", "content": object()}], r"items\[0\]: must be JSON"),
        ([{"role": "user", "content": float("nan")}], r"items\[0\]"),
    ]
    for items, message in bad:
        with pytest.raises(InvalidInputError, match=message):
            asyncio.run(session.add_items(items))
    assert asyncio.run(session.get_items()) == []
    assert store.events("v1") == []
    asyncio.run(session.add_items((ITEM,)))  # type: ignore[arg-type]  # a tuple is a list of items too
    assert asyncio.run(session.get_items()) == [ITEM]


@pytest.mark.parametrize(
    ("args", "field"),
    [
        (("", "o"), "session_id"),
        (("s", ""), "owner"),
        (("x" * 256, "o"), "session_id"),
        ((None, "o"), "session_id"),
    ],
)
def test_an_empty_session_id_or_owner_is_refused_at_construction(
    database_url: str, args: tuple[Any, str], field: str
) -> None:
    """Refused when the session is made, not on its first use."""
    with pytest.raises(InvalidInputError) as info:
        StatekeepSession(args[0], SQLContextStore(database_url), owner=args[1])
    assert info.value.field == field


def test_a_store_of_another_kind_or_a_second_ring_is_refused(database_url: str, tmp_path: Path) -> None:
    """The store is a context store, a Database or a URL; a context store's ring is the session's."""
    ring = KeyRing(database_url, LocalKeyFile(tmp_path / "keys.json"))
    with pytest.raises(InvalidInputError) as info:
        StatekeepSession("s", 42)  # type: ignore[arg-type]
    assert info.value.field == "store"
    with pytest.raises(InvalidInputError) as info:
        StatekeepSession("s", SQLContextStore(database_url), keys=ring)
    assert info.value.field == "keys"
    with pytest.raises(InvalidInputError) as info:
        StatekeepSession("s", database_url, keys="local")  # type: ignore[arg-type]
    assert info.value.field == "keys"


def test_with_a_ring_items_and_events_are_sealed_with_the_owners_key(
    database_url: str, tmp_path: Path
) -> None:
    """An owned session's items and events are sk1 tokens under the owner's key; reading opens them."""
    ring = KeyRing(database_url, LocalKeyFile(tmp_path / "keys.json"))
    session = StatekeepSession("k1", database_url, owner="alice", keys=ring)
    asyncio.run(
        session.add_items([ITEM, {"type": "function_call", "call_id": "c", "name": "f", "arguments": "{}"}])
    )
    items, payloads = _rows(session)
    assert (len(items), len(payloads)) == (2, 2)
    assert all(raw.startswith("sk1:") for raw in items + payloads)
    assert not any("4711" in raw for raw in items + payloads)
    assert ring.owner_of_key(items[0][4:24]) == "alice"
    assert ITEM in [json.loads(ring.open(raw)) for raw in items]
    assert asyncio.run(session.get_items())[0] == ITEM
    # a session opened without the owner seals under the session's recorded owner too
    other = StatekeepSession("k1", database_url, keys=ring)
    asyncio.run(other.add_items([{"role": "assistant", "content": "noted 4711"}]))
    assert all(raw.startswith("sk1:") for raw in _rows(other)[0])
    assert asyncio.run(session.get_items())[-1] == {"role": "assistant", "content": "noted 4711"}
    # without the ring the sealed items cannot be read, and the error says why
    with pytest.raises(SealedDataError):
        asyncio.run(StatekeepSession("k1", database_url, keys=None).get_items())
    for s in (session, other):
        s.close()


def test_keys_none_stores_plain_text_and_an_unowned_session_is_never_sealed(
    database_url: str, tmp_path: Path
) -> None:
    """keys=None keeps the former plain JSON; a session without an owner has no key to seal with."""
    plain = StatekeepSession("p1", database_url, owner="alice", keys=None)
    asyncio.run(plain.add_items([ITEM]))
    assert _rows(plain)[0] == [json.dumps(ITEM)]
    ring = KeyRing(database_url, LocalKeyFile(tmp_path / "keys.json"))
    unowned = StatekeepSession("p2", database_url, keys=ring)
    asyncio.run(unowned.add_items([ITEM]))
    assert _rows(unowned)[0] == [json.dumps(ITEM)]
    assert asyncio.run(unowned.get_items()) == [ITEM]
    # plain rows written without a ring (or before this version) are read as they are
    sealed = StatekeepSession("p1", database_url, owner="alice", keys=ring)
    asyncio.run(sealed.add_items([{"role": "assistant", "content": "ok"}]))
    assert asyncio.run(sealed.get_items()) == [ITEM, {"role": "assistant", "content": "ok"}]


def test_another_owners_session_is_refused_before_anything_is_stored(
    database_url: str, tmp_path: Path
) -> None:
    """The session is claimed first: bob's session refuses alice's items and keeps no row of them."""
    ring = KeyRing(database_url, LocalKeyFile(tmp_path / "keys.json"))
    asyncio.run(StatekeepSession("o1", database_url, owner="bob", keys=ring).add_items([ITEM]))
    for keys in (ring, None):
        intruder = StatekeepSession("o1", database_url, owner="alice", keys=keys)
        with pytest.raises(SessionOwnerError):
            asyncio.run(intruder.add_items([{"role": "user", "content": "mine"}]))
        assert len(_rows(intruder)[0]) == 1


def test_by_default_the_ring_of_the_settings_seals_the_session(
    database_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """No keys=: the key ring STATEKEEP_KEYS names, as Runtime.open opens it; STATEKEEP_KEYS=none: plain."""
    monkeypatch.setenv("STATEKEEP_HOME", str(tmp_path / "home"))
    monkeypatch.setenv("STATEKEEP_DATABASE_URL", database_url)
    session = StatekeepSession("d1", database_url, owner="alice")
    asyncio.run(session.add_items([ITEM]))
    items, payloads = _rows(session)
    assert all(raw.startswith("sk1:") for raw in items + payloads)
    assert (tmp_path / "home" / "keys.json").is_file()
    session.close()
    monkeypatch.setenv("STATEKEEP_KEYS", "none")
    plain = StatekeepSession("d2", database_url, owner="alice")
    asyncio.run(plain.add_items([ITEM]))
    assert _rows(plain)[0] == [json.dumps(ITEM)]
    plain.close()
    monkeypatch.setenv("STATEKEEP_KEYS", "no_such_module_of_keys:provider")
    with pytest.raises(ConfigError, match="STATEKEEP_KEYS"):
        StatekeepSession("d3", database_url, owner="alice")
