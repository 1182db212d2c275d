"""The conformance suite of the context-store contract (:class:`~statekeep.context.ContextStore`)."""

from __future__ import annotations

import pytest

from statekeep.context import (
    ContextStore,
)
from statekeep.testing._context_builds import KeysBuildsSummaries
from statekeep.testing._context_kit import ContextStoreFactory
from statekeep.testing._context_log import LogAndOwners
from statekeep.testing._context_markers import MarkerSuite


class ContextStoreSuite(LogAndOwners, KeysBuildsSummaries, MarkerSuite):
    """The invariants of a :class:`~statekeep.context.ContextStore` backend.

    Subclass it as ``Test...`` and define the fixture ``make_store``: a function
    ``make_store(**options)`` that returns a store over this test's data (empty
    at the start of each test), passing ``options`` (``counter``,
    ``summarizer``, ``high_water``, ``low_water``) to the store's constructor.
    Every call within one test must see the sessions (their events and owners)
    that stores from earlier calls wrote, as a second process would.
    """

    @pytest.fixture
    def make_store(self) -> ContextStoreFactory:
        """The backend under test: override this fixture in the subclass."""
        raise NotImplementedError(f"{type(self).__name__} must define a make_store fixture")

    @pytest.fixture
    def store(self, make_store: ContextStoreFactory) -> ContextStore:
        """A store with the default (tiktoken) counter and the offline summarizer."""
        return make_store()
