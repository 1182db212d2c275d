"""The LanceDB memory backend: an embedded folder, for one machine and one writer (:mod:`.store`).

Its internals: the table's layout and upkeep (:mod:`._layout`), the owners' rows held in process
(:mod:`._owner_cache`), filters as LanceDB SQL (:mod:`._sql`), the folder's writer
lock (:mod:`._lock`) and reading the folder's files back (:mod:`._files`).
"""

from statekeep.memory.lancedb.store import LanceDBMemoryStore

__all__ = ["LanceDBMemoryStore"]
