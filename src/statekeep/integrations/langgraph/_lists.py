"""Grown lists: which stored version a list channel's new value extends, and the delta row.

The saver remembers, per (thread, ns, channel), the serialized items of the latest
version it wrote (a bounded LRU); after a restart or a miss it reads the parent
checkpoint's version back. A new value whose items start with those bytes is stored
as the tail only, pointing at the version it extends.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from sqlalchemy.engine import Connection

from statekeep.integrations.langgraph import _delta, _sql

#: Serialized bytes of the latest value of a list channel kept per (thread, ns, channel), at most.
CACHE_ENTRIES = 256

_Key = tuple[str, str, str]


@dataclass(frozen=True, slots=True)
class Last:
    """The latest stored version of a list channel and its serialized items."""

    version: str
    count: int
    body: bytes


class Lists:
    """The latest list value written per channel, and the rows that store a new one."""

    def __init__(self) -> None:
        self._last: OrderedDict[_Key, Last] = OrderedDict()
        self._lock = threading.Lock()

    def blob_row(
        self,
        conn: Connection,
        where: tuple[str, str],
        channel: str,
        version: str,
        typed: tuple[str, bytes | None],
        parent_id: str | None,
    ) -> dict[str, Any]:
        """The blob row of one channel's new version: a delta when it extends the previous list."""
        thread_id, ns = where
        type_, data = typed
        row: dict[str, Any] = {
            "thread_id": thread_id,
            "checkpoint_ns": ns,
            "channel": channel,
            "version": version,
            "type": type_,
            "blob": data,
            "base_version": None,
            "added": None,
        }
        array = _delta.split_array(data) if type_ == "msgpack" and data else None
        if array is None:
            return row
        count, body = array
        key = (thread_id, ns, channel)
        last = self._cached(key) or _previous(conn, key, parent_id)
        self._remember(key, Last(version, count, bytes(body)))
        if (
            last is not None
            and last.version != version
            and count >= last.count
            and body[: len(last.body)] == last.body
            and _sql.blob_exists(conn, thread_id, ns, channel, last.version)
        ):
            row.update(type=_sql.DELTA, blob=bytes(body[len(last.body) :]), base_version=last.version)
            row["added"] = count - last.count
        return row

    def forget(self, thread_ids: Sequence[str]) -> None:
        """Drop what is remembered of these threads (deleted or pruned)."""
        drop = set(thread_ids)
        with self._lock:
            for key in [k for k in self._last if k[0] in drop]:
                del self._last[key]

    def _cached(self, key: _Key) -> Last | None:
        with self._lock:
            return self._last.get(key)

    def _remember(self, key: _Key, last: Last) -> None:
        with self._lock:
            self._last[key] = last
            self._last.move_to_end(key)
            while len(self._last) > CACHE_ENTRIES:
                self._last.popitem(last=False)


def _previous(conn: Connection, key: _Key, parent_id: str | None) -> Last | None:
    """The channel's value at the parent checkpoint, read back (after a restart, or a cache miss)."""
    thread_id, ns, channel = key
    if parent_id is None:
        return None
    version = _sql.channel_version(conn, thread_id, ns, parent_id, channel)
    if version is None:
        return None
    data = _sql.load_channels(conn, thread_id, ns, {channel: version}).get(channel)
    if data is None or data[0] != "msgpack":
        return None
    array = _delta.split_array(data[1])
    return None if array is None else Last(version, array[0], bytes(array[1]))
