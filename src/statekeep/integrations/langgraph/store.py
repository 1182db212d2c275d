"""``StatekeepStore``: LangGraph's long-term ``BaseStore`` over a statekeep memory store.

Every LangGraph namespace belongs to an *owner* (by default its first label), and
each item is stored as memories of that owner. So ``memory.forget(owner)`` erases a
user's LangGraph items with the rest of their memories (physically, on LanceDB), and
pgvector's row-level security confines a role to its owner's items.

An item is one memory per text it indexes (``index["fields"]`` or ``put(index=...)``;
the first holds the value), or a single unindexed memory. Memory ids are derived
from (namespace, key), so a get is a lookup, not a scan. Values are JSON.

The adapter writes through the memory store's public contract: ``insert`` (it chooses
the ids, and the vectors LangGraph's index asks for) and ``forget_many``.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
from collections.abc import Callable, Iterable, Mapping, Sequence
from datetime import UTC, datetime
from typing import Any, cast

import numpy as np

from statekeep._check import MAX_ID, check_id
from statekeep.db.catalog import Erased, Erasing, StoreSpec
from statekeep.errors import ConfigError, InvalidInputError, MemoryNotFoundError
from statekeep.integrations._extras import missing
from statekeep.memory import Memory, MemoryStore, Provenance
from statekeep.memory.embedders import Vectors, check_vectors

try:
    from langgraph.store.base import (
        BaseStore,
        GetOp,
        IndexConfig,
        Item,
        ListNamespacesOp,
        MatchCondition,
        Op,
        PutOp,
        Result,
        SearchItem,
        SearchOp,
        get_text_at_path,
        tokenize_path,
    )
except ImportError as exc:  # pragma: no cover - exercised without the extra
    raise missing("langgraph", "statekeep.integrations.langgraph", exc) from exc

__all__ = ["LangChainEmbedder", "StatekeepStore"]

#: Vector hits read per owner for one search (the memory store's largest ``k``).
SEARCH_POOL = 1000
_ITEM, _VEC, _OWNER = "lg:item", "lg:vec", "lg:owner"
#: The memory owner of a store's owner registry, after the store's ``scope``: one memory per owner,
#: whose id is a digest of the owner id and whose content is the owner id.
REGISTRY = "statekeep.langgraph.owners"


class LangChainEmbedder:
    """A statekeep embedder over LangChain ``Embeddings`` (what LangGraph's ``index["embed"]`` takes)."""

    def __init__(self, embeddings: Any, dimension: int, *, name: str | None = None) -> None:
        self.embeddings = embeddings
        self._dimension = int(dimension)
        self._name = name or f"langchain:{type(embeddings).__name__}-{dimension}"

    @property
    def name(self) -> str:
        """The model name stored with each memory."""
        return self._name

    @property
    def dimension(self) -> int:
        """The vectors' dimension."""
        return self._dimension

    def embed(self, texts: Sequence[str]) -> Vectors:
        """Embed a batch (``embed_documents``)."""
        vectors = np.asarray(self.embeddings.embed_documents(list(texts)), dtype=np.float32)
        return vectors.reshape(len(texts), self._dimension)


class StatekeepStore(BaseStore):
    """LangGraph's long-term store, with vector search, on a statekeep memory store.

    Examples:
        >>> from statekeep.memory import FakeEmbedder, InMemoryMemoryStore
        >>> store = StatekeepStore(InMemoryMemoryStore(FakeEmbedder(), duplicate_threshold=None))
        >>> store.put(("alice", "prefs"), "drink", {"text": "green tea"})
        >>> store.get(("alice", "prefs"), "drink").value
        {'text': 'green tea'}

    Args:
        memory: the memory store (LanceDB, pgvector, in-memory); built with
            ``duplicate_threshold=None`` (LangGraph items are never merged).
        index: LangGraph's index config (``dims``, ``fields``); the vectors come from
            the memory store's embedder (wrap LangChain embeddings with :class:`LangChainEmbedder`).
            Without it, search filters but does not rank.
        owner_label: which label of a namespace names its owner (default the first).
        scope: a prefix of every owner id, to keep several applications apart in one store.
    """

    supports_ttl = False

    def __init__(
        self,
        memory: MemoryStore,
        *,
        index: IndexConfig | None = None,
        owner_label: int = 0,
        scope: str = "",
    ) -> None:
        if memory.duplicate_threshold is not None:
            raise ConfigError(
                "duplicate_threshold", str(memory.duplicate_threshold), "a LangGraph store needs it None"
            )
        if (
            index is not None
            and int(index.get("dims", memory.embedder.dimension)) != memory.embedder.dimension
        ):
            raise ConfigError(
                "index.dims", str(index.get("dims")), "differs from the memory store's embedder"
            )
        self.memory = memory
        self.index_config = index
        self.owner_label = int(owner_label)
        self.scope = scope
        fields = (index or {}).get("fields") or ["$"]
        self._fields = [(p, tokenize_path(p) if p != "$" else p) for p in fields]
        self._registry = f"{scope}{REGISTRY}"
        self._owners: set[str] = set()

    # --- owners ---------------------------------------------------------------------------

    def owner_of(self, namespace: tuple[str, ...]) -> str:
        """The memory owner of a namespace."""
        label = namespace[self.owner_label] if len(namespace) > self.owner_label else namespace[0]
        return f"{self.scope}{label}"

    def owners(self) -> list[str]:
        """Every owner that has (had) items in this store."""
        return sorted(m.content for m in self.memory.list_memories(self._registry))

    def forget(self, owner: str) -> int:
        """Erase an owner's items (all their memories, as ``memory.forget``) and the owner's registration."""
        receipt = self.memory.forget(owner)
        self.memory.forget_many(self._registry, [_digest(owner)])
        self._owners.discard(owner)
        return receipt.removed

    def _register(self, owner: str) -> None:
        if owner in self._owners:
            return
        mid = _digest(owner)
        try:
            self.memory.get(self._registry, mid)
        except MemoryNotFoundError:
            now = datetime.now(UTC)
            row = self._memory(self._registry, mid, owner, (_OWNER,), {}, now)
            self.memory.insert([row], self._unit(1))
        self._owners.add(owner)

    def _routes(self, prefix: Sequence[str]) -> list[str]:
        if len(prefix) > self.owner_label and prefix[self.owner_label] != "*":
            return [self.owner_of(tuple(prefix))]
        return self.owners()

    # --- the BaseStore contract -------------------------------------------------------------

    def batch(self, ops: Iterable[Op]) -> list[Result]:
        ops = list(ops)
        results: list[Result] = [None] * len(ops)
        puts: dict[tuple[tuple[str, ...], str], PutOp] = {}
        for i, op in enumerate(ops):
            if isinstance(op, GetOp):
                results[i] = self._get(op.namespace, op.key)
            elif isinstance(op, SearchOp):
                results[i] = self._search(op)
            elif isinstance(op, ListNamespacesOp):
                results[i] = self._list_namespaces(op)
            elif isinstance(op, PutOp):
                puts[(op.namespace, op.key)] = op
            else:
                raise ValueError(f"Unknown operation type: {type(op)}")
        if puts:
            self._apply(list(puts.values()))
        return results

    async def abatch(self, ops: Iterable[Op]) -> list[Result]:
        return await asyncio.to_thread(self.batch, list(ops))

    # --- reading ----------------------------------------------------------------------------

    def _get(self, namespace: tuple[str, ...], key: str) -> Item | None:
        try:
            memory = self.memory.get(self.owner_of(namespace), _item_id(namespace, key))
        except MemoryNotFoundError:
            return None
        return _item(memory)

    def _items(self, owners: list[str], prefix: Sequence[str]) -> list[Item]:
        n = len(prefix)
        found = []
        for owner in owners:
            for memory in self.memory.list_memories(owner):
                if _ITEM in memory.tags:
                    item = _item(memory)
                    if item.namespace[:n] == tuple(prefix):
                        found.append(item)
        found.sort(key=lambda i: (i.created_at, i.namespace, i.key))
        return found

    def _search(self, op: SearchOp) -> list[SearchItem]:
        prefix = tuple(op.namespace_prefix)
        owners = self._routes(prefix)
        candidates = [
            i
            for i in self._items(owners, prefix)
            if not op.filter or all(_compare(i.value.get(k), v) for k, v in op.filter.items())
        ]
        if not (op.query and self.index_config):
            page = candidates[op.offset : op.offset + op.limit]
            return [_search_item(i, None) for i in page]
        scores = self._scores(owners, prefix, op.query)
        ranked = sorted(
            (i for i in candidates if (i.namespace, i.key) in scores),
            key=lambda i: -scores[(i.namespace, i.key)],
        )
        kept = [
            _search_item(i, scores[(i.namespace, i.key)]) for i in ranked[op.offset : op.offset + op.limit]
        ]
        if len(kept) < op.limit:  # like LangGraph's stores: unindexed items fill the page, unscored
            scoreless = [i for i in candidates if (i.namespace, i.key) not in scores]
            kept += [_search_item(i, None) for i in scoreless[: op.limit - len(kept)]]
        return kept

    def _scores(
        self, owners: list[str], prefix: tuple[str, ...], query: str
    ) -> dict[tuple[tuple[str, ...], str], float]:
        vector = self._embed([query])[0]
        tags = [_VEC, *([_prefix_tag(prefix)] if prefix else [])]
        best: dict[tuple[tuple[str, ...], str], float] = {}
        for owner in owners:
            # cosine scores, comparable across owners and with LangGraph's own stores
            hits = self.memory.search(
                owner, query, k=SEARCH_POOL, tags=tags, vector=vector.tolist(), mode="vector"
            )
            for hit in hits:
                meta = hit.memory.metadata["langgraph"]
                where = (tuple(meta["namespace"]), str(meta["key"]))
                best[where] = max(best.get(where, -2.0), float(hit.score))
        return best

    def _list_namespaces(self, op: ListNamespacesOp) -> list[tuple[str, ...]]:
        conditions = op.match_conditions or ()
        prefix = next((c.path for c in conditions if c.match_type == "prefix"), ())
        namespaces = {i.namespace for i in self._items(self._routes(prefix), ())}
        matching = [ns for ns in namespaces if all(_matches(c, ns) for c in conditions)]
        if op.max_depth is not None:
            matching = list({ns[: op.max_depth] for ns in matching})
        return sorted(matching)[op.offset : op.offset + op.limit]

    # --- writing ----------------------------------------------------------------------------

    def _apply(self, puts: list[PutOp]) -> None:
        by_owner: dict[str, list[PutOp]] = {}
        for op in puts:
            by_owner.setdefault(self.owner_of(op.namespace), []).append(op)
        for owner, ops in by_owner.items():
            self._register(owner)
            now = datetime.now(UTC)
            doomed: list[str] = []
            rows: list[Memory] = []
            texts: list[str | None] = []
            for op in ops:
                old = self._get(op.namespace, op.key)
                if old is not None:
                    doomed += self._ids(op.namespace, op.key)
                if op.value is None:
                    continue
                new_rows, new_texts = self._rows(owner, op, old.created_at if old else now, now)
                rows += new_rows
                texts += new_texts
            if doomed:
                self.memory.forget_many(owner, doomed)
            if rows:
                self.memory.insert(rows, self._vectors(texts))

    def _ids(self, namespace: tuple[str, ...], key: str) -> list[str]:
        base = _item_id(namespace, key)
        primary = self.memory.get(self.owner_of(namespace), base)
        count = int(primary.metadata["langgraph"].get("vectors", 1))
        return [base] + [f"{base}-{i}" for i in range(1, count)]

    def _rows(
        self, owner: str, op: PutOp, created: datetime, now: datetime
    ) -> tuple[list[Memory], list[str | None]]:
        value = _json(op.value or {})
        texts = self._texts(value, op.index)
        base = _item_id(op.namespace, op.key)
        tags = [_prefix_tag(op.namespace[:i]) for i in range(1, len(op.namespace) + 1)]
        where = {"namespace": list(op.namespace), "key": op.key}
        primary_meta = {
            "langgraph": {
                **where,
                "value": value,
                "created_at": created.isoformat(),
                "updated_at": now.isoformat(),
                "vectors": max(len(texts), 1),
            }
        }
        if not texts:
            content = json.dumps(value, ensure_ascii=False)[:60_000] or "{}"
            return [self._memory(owner, base, content, (_ITEM, *tags), primary_meta, now)], [None]
        rows = [self._memory(owner, base, texts[0], (_ITEM, _VEC, *tags), primary_meta, now)]
        rows += [
            self._memory(owner, f"{base}-{i}", text, (_VEC, *tags), {"langgraph": where}, now)
            for i, text in enumerate(texts[1:], start=1)
        ]
        return rows, list(texts)

    def _texts(self, value: dict[str, Any], index: Any) -> list[str]:
        if self.index_config is None or index is False:
            return []
        paths = self._fields if index is None else [(p, tokenize_path(p)) for p in index]
        texts: list[str] = []
        for _, path in paths:
            texts += [t for t in get_text_at_path(value, path) if t]
        return texts

    def _memory(
        self, owner: str, mid: str, content: str, tags: tuple[str, ...], meta: dict[str, Any], now: datetime
    ) -> Memory:
        return Memory(
            id=mid,
            owner=owner,
            content=content,
            kind="semantic",
            tags=tags,
            metadata=meta,
            provenance=Provenance("user_supplied"),
            model=self.memory.embedder.name,
            created_at=now,
        )

    def _vectors(self, texts: list[str | None]) -> Vectors:
        out = self._unit(len(texts))
        wanted = [i for i, t in enumerate(texts) if t is not None]
        if wanted:
            out[wanted] = self._embed([cast(str, texts[i]) for i in wanted])
        return out

    def _embed(self, texts: list[str]) -> Vectors:
        embedder = self.memory.embedder
        return check_vectors(embedder, embedder.embed(texts), len(texts))

    def _unit(self, count: int) -> Vectors:
        """Placeholder vectors of rows that are not indexed (never ranked: they lack the ``lg:vec`` tag)."""
        out = np.zeros((count, self.memory.embedder.dimension), dtype=np.float32)
        out[:, 0] = 1.0
        return out


def forget_registration(memory: MemoryStore, owner: str) -> int:
    """Erasure: remove ``owner`` from the owner registry of every :class:`StatekeepStore` on ``memory``.

    The owner's items are the owner's memories (``memory.forget(owner)`` erases them);
    the registry is a memory of another owner that holds the owner id. Each scope a
    store may have used is a prefix of the owner id (its owners are ``scope + label``),
    so every prefix's registry is looked up (a read each); an entry found is erased as
    ``forget_many`` erases (physically). Returns how many entries went.

    Raises:
        InvalidInputError: ``owner`` is not an owner id.
    """
    check_id(owner, "owner")
    mid, removed = _digest(owner), 0
    for end in range(len(owner)):
        registry = f"{owner[:end]}{REGISTRY}"
        if len(registry) > MAX_ID:
            break
        try:
            memory.get(registry, mid)
        except MemoryNotFoundError:
            continue
        removed += memory.forget_many(registry, [mid]).removed
    return removed


# --- helpers ---------------------------------------------------------------------------------


def _digest(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()[:32]


def _item_id(namespace: tuple[str, ...], key: str) -> str:
    return _digest(json.dumps([list(namespace), key], ensure_ascii=False))


def _prefix_tag(prefix: Sequence[str]) -> str:
    return "lgns:" + _digest(json.dumps(list(prefix), ensure_ascii=False))


def _json(value: Mapping[str, Any]) -> dict[str, Any]:
    try:
        again: dict[str, Any] = json.loads(json.dumps(dict(value), allow_nan=False))
    except (TypeError, ValueError) as exc:
        raise InvalidInputError(f"must be JSON: {exc}", field="value") from exc
    return again


def _item(memory: Memory) -> Item:
    meta = memory.metadata["langgraph"]
    return Item(
        value=dict(meta["value"]),
        key=str(meta["key"]),
        namespace=tuple(meta["namespace"]),
        created_at=datetime.fromisoformat(meta["created_at"]),
        updated_at=datetime.fromisoformat(meta["updated_at"]),
    )


def _search_item(item: Item, score: float | None) -> SearchItem:
    return SearchItem(
        namespace=item.namespace,
        key=item.key,
        value=item.value,
        created_at=item.created_at,
        updated_at=item.updated_at,
        score=score,
    )


def _matches(condition: MatchCondition, namespace: tuple[str, ...]) -> bool:
    path = condition.path
    if len(namespace) < len(path):
        return False
    pairs = (
        zip(namespace, path, strict=False)
        if condition.match_type == "prefix"
        else zip(reversed(namespace), reversed(path), strict=False)
    )
    return all(p == "*" or k == p for k, p in pairs)


_OPERATORS: dict[str, Callable[[Any, Any], bool]] = {
    "$eq": lambda a, b: bool(a == b),
    "$ne": lambda a, b: bool(a != b),
    "$gt": lambda a, b: float(a) > float(b),
    "$gte": lambda a, b: float(a) >= float(b),
    "$lt": lambda a, b: float(a) < float(b),
    "$lte": lambda a, b: float(a) <= float(b),
}


def _compare(value: Any, wanted: Any) -> bool:
    """LangGraph's filter semantics: equality, nested objects, ``$gt``-style operators."""
    if isinstance(wanted, dict):
        if any(str(k).startswith("$") for k in wanted):
            for name, operand in wanted.items():
                if name not in _OPERATORS:
                    raise InvalidInputError(f"unsupported operator {name!r}", field="filter")
                try:
                    if not _OPERATORS[name](value, operand):
                        return False
                except (TypeError, ValueError):
                    return False
            return True
        return isinstance(value, dict) and all(_compare(value.get(k), v) for k, v in wanted.items())
    if isinstance(wanted, list | tuple):
        return (
            isinstance(value, list | tuple)
            and len(value) == len(wanted)
            and all(_compare(a, b) for a, b in zip(value, wanted, strict=False))
        )
    return bool(value == wanted)


def _erase_registration(memory: MemoryStore | None, erasing: Erasing) -> Erased | None:
    """The owner's entries in the stores' owner registries of the runtime's memory store."""
    if memory is None:
        return None
    return Erased({"registrations": forget_registration(memory, erasing.owner)})


#: The store's owner registry, declared as a part of long-term memory: its items are the owner's
#: memories (erased by ``memory.forget``), the registry a memory of another owner naming them.
REGISTRATIONS: StoreSpec[MemoryStore] = StoreSpec(
    "langgraph_store", part_of="memory", erase=_erase_registration
)
