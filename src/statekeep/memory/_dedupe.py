"""Which memories are the same fact: text normalisation, the stored identity, the store's policy."""

from __future__ import annotations

import dataclasses
import hashlib
import unicodedata
from typing import Any

import numpy as np

from statekeep.errors import InvalidInputError
from statekeep.memory._types import DEDUPE_MODES, Dedupe, DedupeMode, Memory, SearchResult
from statekeep.memory.embedders import Vectors
from statekeep.memory.recall._sentences import Parts


def normalize(text: str) -> str:
    """The text as compared for exact deduplication: NFKC, case-folded, whitespace collapsed.

    Examples:
        >>> normalize("  Bye   JOANNA!\\u00a0Good luck! ")
        'bye joanna! good luck!'
    """
    return " ".join(unicodedata.normalize("NFKC", text).casefold().split())


def identity(content: str, key: str | None) -> str:
    """What makes two memories of one owner the same fact: the caller's key, else the normalised text.

    Stored (``dedupe_key``) and indexed; the text's form is a hash, so the column stays small.
    """
    if key is not None:
        return "key:" + key
    return "text:" + hashlib.sha256(normalize(content).encode()).hexdigest()


#: With ``dedupe="similar"``: the cosine similarity at or above which a new memory is merged
#: into an existing one (linked with ``duplicate_of``).
DEFAULT_DUPLICATE_THRESHOLD = 0.92


class _Unset:
    def __repr__(self) -> str:
        return "<unset>"


#: ``duplicate_threshold`` left out: it is then only used by ``dedupe="similar"`` (at 0.92).
UNSET: Any = _Unset()


def merged(memory: Memory) -> Memory:
    """A stored memory as ``remember`` returns it: if it was merged into another, saying so."""
    if memory.duplicate_of is None:
        return memory
    why = Dedupe("similar", memory.duplicate_of, stored=True, similarity=memory.duplicate_score)
    return dataclasses.replace(memory, dedupe=why)


def policy(dedupe: object, threshold: object) -> tuple[DedupeMode, float | None]:
    """The deduplication mode and threshold from the store's arguments (old ones included)."""
    if (
        threshold is not UNSET
        and threshold is not None
        and (isinstance(threshold, bool) or not isinstance(threshold, int | float) or not 0 < threshold <= 1)
    ):
        raise InvalidInputError("must be in (0, 1]", field="duplicate_threshold")
    if dedupe is None:  # before 'dedupe' existed: a threshold meant similarity merging, None meant off
        if threshold is UNSET:
            return "exact", None
        return ("none", None) if threshold is None else ("similar", float(threshold))
    mode: DedupeMode | None = next((m for m in DEDUPE_MODES if dedupe == m and isinstance(dedupe, str)), None)
    if mode is None:
        raise InvalidInputError(f"{dedupe!r} is not one of {list(DEDUPE_MODES)}", field="dedupe")
    if mode == "similar":
        if threshold is None:
            raise InvalidInputError(
                "dedupe='similar' needs a threshold in (0, 1]", field="duplicate_threshold"
            )
        return mode, DEFAULT_DUPLICATE_THRESHOLD if threshold is UNSET else float(threshold)
    if threshold is not UNSET and threshold is not None:
        raise InvalidInputError("is used only with dedupe='similar'", field="duplicate_threshold")
    return mode, None


def plan(idents: list[str], found: dict[str, Memory], policy: DedupeMode) -> tuple[dict[str, int], list[int]]:
    """Which items of a batch to store: (identity -> the item that stores it, the items to store).

    An item is stored unless the policy deduplicates and its identity is stored already
    (``found``) or belongs to an earlier item of the batch.
    """
    first: dict[str, int] = {}
    fresh: list[int] = []
    for i, ident in enumerate(idents):
        if policy == "none" or (ident not in found and ident not in first):
            first.setdefault(ident, i)
            fresh.append(i)
    return first, fresh


#: The vectors and sentence vectors of a write that stores nothing.
NOTHING: tuple[Vectors, Parts] = (np.empty((0, 0), dtype=np.float32), [])


def replan(
    idents: list[str],
    found: dict[str, Memory],
    policy: DedupeMode,
    fresh: list[int],
    vectors: Vectors,
    parts: Parts,
) -> tuple[dict[str, int], list[int], Vectors, Parts]:
    """:func:`plan` again, after another look found more of the identities (``found``), with the
    vectors and sentence vectors (embedded already, one per item of ``fresh``) of the items still to store."""
    first, kept = plan(idents, found, policy)
    if kept == fresh:
        return first, fresh, vectors, parts
    row = {item: n for n, item in enumerate(fresh)}
    rows = [row[item] for item in kept]
    return first, kept, vectors[rows], [parts[i] for i in rows]


def similar_links(
    vectors: Vectors, ids: list[str], stored: list[SearchResult | None], threshold: float
) -> list[tuple[str, float] | None]:
    """For each new vector, the memory it merges into (a stored one, or an earlier new one) and the cosine.

    ``stored`` holds each vector's nearest stored memory; a new memory merges into the
    nearest of that and the batch's earlier items that are not merged themselves, if at
    least ``threshold`` close.
    """
    links: list[tuple[str, float] | None] = []
    originals: list[int] = []  # batch items that are not duplicates themselves
    for i, vec in enumerate(vectors):
        hit = stored[i]
        score, link = (hit.score, hit.memory.id) if hit else (-1.0, None)
        if originals:
            sims = vectors[originals] @ vec
            j = int(np.argmax(sims))
            if sims[j] > score:
                score, link = float(sims[j]), ids[originals[j]]
        links.append((link, score) if link is not None and score >= threshold else None)
        if links[-1] is None:
            originals.append(i)
    return links
