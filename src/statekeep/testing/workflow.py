"""The conformance suite of the workflow-store contract (:class:`~statekeep.workflow.WorkflowStore`).

The suite drives the store through an :class:`~statekeep.workflow.Engine`, as an
application does, and through the contract's own methods where an invariant is
the store's alone (fencing, claims, retention).
"""

from __future__ import annotations

import pytest

from statekeep.testing._workflow_calls import CallsAndWaits
from statekeep.testing._workflow_kit import WorkflowStoreFactory
from statekeep.testing._workflow_runs import RunsAndLeases
from statekeep.workflow import (
    WorkflowStore,
)
from statekeep.working import InMemoryWorkingStateStore, WorkingStateStore


class WorkflowStoreSuite(RunsAndLeases, CallsAndWaits):
    """The invariants of a :class:`~statekeep.workflow.WorkflowStore` backend.

    Subclass it as ``Test...`` and define the fixture ``make_store``: a function
    ``make_store()`` that returns a store over this test's data (empty at the
    start of each test); every call within one test must see what stores from
    earlier calls wrote, as a second process would. The suite closes nothing:
    close the stores in the fixture's teardown. Override ``state_store`` to run
    the working-state tests against another working-state backend (by default
    an :class:`~statekeep.working.InMemoryWorkingStateStore`).
    """

    @pytest.fixture
    def make_store(self) -> WorkflowStoreFactory:
        """The backend under test: override this fixture in the subclass."""
        raise NotImplementedError(f"{type(self).__name__} must define a make_store fixture")

    @pytest.fixture
    def store(self, make_store: WorkflowStoreFactory) -> WorkflowStore:
        """A store over the test's data."""
        return make_store()

    @pytest.fixture
    def state_store(self) -> WorkingStateStore:
        """The working-state store the engines of the state tests use."""
        return InMemoryWorkingStateStore()
