"""Which memories are the same fact: text normalisation and the stored identity (pure)."""

from __future__ import annotations

import hashlib
import unicodedata


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
