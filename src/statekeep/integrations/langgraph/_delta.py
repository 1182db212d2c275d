"""Deltas of serialized list channels: msgpack arrays that only grew.

A msgpack array is a header (its length) followed by its items, each encoded on
its own. A list that extends another therefore serializes to the other's item
bytes followed by the new items' bytes: the delta is that tail, and joining the
bodies of a chain under one new header gives back the exact bytes of the list.
No item is decoded to compute or apply a delta.
"""

from __future__ import annotations

import struct
from collections.abc import Iterable


def split_array(data: bytes) -> tuple[int, memoryview] | None:
    """``(item count, item bytes)`` of a msgpack array, None when ``data`` is not one."""
    if not data:
        return None
    head = data[0]
    if 0x90 <= head <= 0x9F:
        return head & 0x0F, memoryview(data)[1:]
    if head == 0xDC and len(data) >= 3:
        return struct.unpack_from(">H", data, 1)[0], memoryview(data)[3:]
    if head == 0xDD and len(data) >= 5:
        return struct.unpack_from(">I", data, 1)[0], memoryview(data)[5:]
    return None


def array_header(count: int) -> bytes:
    """The msgpack header of an array of ``count`` items."""
    if count < 16:
        return bytes([0x90 | count])
    if count < 0x10000:
        return b"\xdc" + struct.pack(">H", count)
    return b"\xdd" + struct.pack(">I", count)


def join(parts: Iterable[tuple[int, bytes | memoryview]]) -> bytes:
    """The msgpack array made of the ``(count, item bytes)`` parts, in order."""
    chunks = list(parts)
    total = sum(count for count, _ in chunks)
    return array_header(total) + b"".join(bytes(body) for _, body in chunks)
