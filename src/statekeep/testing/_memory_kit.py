"""Shared pieces of the memory conformance suite: the store factory, facts, hostile owner ids, a clock."""

from __future__ import annotations

from collections.abc import Callable
from datetime import UTC, datetime

from statekeep.memory import MemoryStore

#: Opens a store over the test's data: ``make_store(embedder, **options)``.
MemoryStoreFactory = Callable[..., MemoryStore]

FACTS = [
    "Alice prefers green tea over coffee in the morning.",
    "Alice's dog is a border collie called Rex.",
    "Alice works as a structural engineer in Lisbon.",
    "Alice is allergic to peanuts.",
    "To deploy the billing service, run make release and then tag the commit.",
]

#: Owner ids that a backend building queries or paths from strings could get wrong.
HOSTILE_OWNERS = ["a' OR '1'='1", "%", "_", "../x", "a\\", "b\\' OR 1=1 --", "*", "' ; DROP TABLE x; --"]


class Clock:
    """A clock a test can move."""

    def __init__(self) -> None:
        self.now = datetime(2026, 1, 1, tzinfo=UTC)

    def __call__(self) -> datetime:
        return self.now
