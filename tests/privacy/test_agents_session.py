"""The Agents SDK session under erasure: its items are sealed, erased with their owner, and unrecoverable.

Each backend pair of tests/privacy (SQLite + LanceDB, PostgreSQL + pgvector). The scans
read every file of the database, as an attacker who also holds the key file would
(tests/privacy/scan.py), before the erasure (where they must find the owner's words)
and after it.
"""

from __future__ import annotations

import asyncio
import json
import uuid
from pathlib import Path

import pytest
import sqlalchemy as sa

pytest.importorskip("agents", reason="the agents extra")

from statekeep.config import Settings
from statekeep.context import SQLContextStore
from statekeep.db import Database
from statekeep.db.migrations import current_version
from statekeep.errors import SealedDataError
from statekeep.integrations._agents_items import SCHEMA, items_table
from statekeep.integrations.agents import StatekeepSession
from statekeep.runtime import Runtime
from tests.privacy.conftest import Cli
from tests.privacy.scan import plain_hits, postgres_files, recoverable_hits, sqlite_files


def _files(settings: Settings) -> list[Path]:
    url = settings.database_url
    return sqlite_files(url) if url.startswith("sqlite") else postgres_files(url)


def _stored(db: Database, session_id: str) -> list[str]:
    """The raw item column of a session's rows, as the database holds it."""
    db.register_schema(SCHEMA)
    with db.read() as conn:
        q = sa.select(items_table.c.item).where(items_table.c.session_id == session_id)
        return [str(v) for v in conn.execute(q).scalars()]


def _said(marker: str) -> list[dict[str, str]]:
    return [{"role": "user", "content": f"my PIN is {marker}"}, {"role": "assistant", "content": "noted"}]


def test_erase_owner_removes_the_sdk_items_and_leaves_nothing_recoverable(
    settings: Settings, runtime: Runtime
) -> None:
    """Items of alice's SDK sessions are sealed at rest, counted and deleted by erase_owner; bob's stay."""
    alice, bob = f"zqsdka{uuid.uuid4().hex[:12]}", f"zqsdkb{uuid.uuid4().hex[:12]}"
    assert isinstance(runtime.context, SQLContextStore)
    mine = StatekeepSession("alice-sdk", runtime.context, owner="alice")  # the runtime's store and ring
    theirs = StatekeepSession("bob-sdk", settings.database_url, owner="bob", keys=runtime.keys)
    asyncio.run(mine.add_items(_said(alice)))
    asyncio.run(theirs.add_items(_said(bob)))
    key_file = settings.home / "keys.json"

    assert plain_hits(_files(settings), [alice, bob]) == set()  # sealed: items and events alike
    assert recoverable_hits(_files(settings), key_file, ["alice", "bob"], [alice, bob]) == {alice, bob}

    receipt = runtime.erase_owner("alice")

    assert receipt.agents == {"items": 2}
    assert receipt.counts()["agents.items"] == 2
    assert receipt.as_dict()["agents"] == {"items": 2}
    assert receipt.context["sessions"] == 1
    assert _stored(runtime.context.db, "alice-sdk") == []
    assert asyncio.run(mine.get_items()) == []
    files = _files(settings)
    assert recoverable_hits(files, key_file, ["alice", "bob"], [alice]) == set()
    assert plain_hits(files, [alice]) == set()
    # bob's session is intact, and the scan still sees it
    assert asyncio.run(theirs.get_items()) == _said(bob)
    assert recoverable_hits(files, key_file, ["alice", "bob"], [bob]) == {bob}
    theirs.close()


def test_a_shredded_key_leaves_a_copied_item_unreadable(settings: Settings, runtime: Runtime) -> None:
    """An item row copied before the erasure (a backup) cannot be opened after it: its key is shredded."""
    marker = f"zqsdkc{uuid.uuid4().hex[:12]}"
    assert isinstance(runtime.context, SQLContextStore)
    assert runtime.keys is not None
    session = StatekeepSession("alice-sdk", runtime.context, owner="alice")
    asyncio.run(session.add_items(_said(marker)[:1]))
    [copied] = _stored(runtime.context.db, "alice-sdk")
    assert copied.startswith("sk1:")
    assert marker not in copied
    assert marker in runtime.keys.open(copied)
    runtime.erase_owner("alice")
    runtime.keys.forget_cache()
    with pytest.raises(SealedDataError, match="shredded"):
        runtime.keys.open(copied)


def test_erasure_works_where_the_adapter_never_ran(settings: Settings, runtime: Runtime) -> None:
    """Without the items table, erasure counts no items and creates nothing."""
    assert isinstance(runtime.context, SQLContextStore)
    runtime.context.append("alice-s1", {"role": "user", "content": "hello"}, owner="alice")
    receipt = runtime.erase_owner("alice")
    assert receipt.agents == {"items": 0}
    assert receipt.context["sessions"] == 1
    assert current_version(runtime.context.db, "agents", SCHEMA) == 0


def test_by_default_the_session_seals_with_the_settings_ring_and_the_cli_erases_it(
    settings: Settings, runtime: Runtime, cli: Cli
) -> None:
    """No keys=: the settings' ring seals the session, as Runtime.open's; `statekeep erase` removes it."""
    marker = f"zqsdkd{uuid.uuid4().hex[:12]}"
    session = StatekeepSession("alice-sdk", settings.database_url, owner="alice")  # settings from the env
    asyncio.run(session.add_items(_said(marker)))
    assert all(v.startswith("sk1:") for v in _stored(session.db, "alice-sdk"))
    key_file = settings.home / "keys.json"
    assert plain_hits(_files(settings), [marker]) == set()
    assert recoverable_hits(_files(settings), key_file, ["alice"], [marker]) == {marker}
    assert asyncio.run(session.get_items()) == _said(marker)

    code, out = cli("erase", "alice", "--yes")

    assert code == 0, out
    assert json.loads(out)["agents"] == {"items": 2}
    assert _stored(session.db, "alice-sdk") == []
    assert recoverable_hits(_files(settings), key_file, ["alice"], [marker]) == set()
    session.close()
