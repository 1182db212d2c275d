"""Conformance suites: one pytest test class per store contract, for any backend.

Write a backend, subclass the suite of its contract in your own tests, give it a
``make_store`` fixture that opens your backend, and run pytest: every test of the
suite is an invariant statekeep's own backends keep, named after it::

    import pytest
    from statekeep.testing import WorkingStateStoreSuite

    class TestMyStore(WorkingStateStoreSuite):
        @pytest.fixture
        def make_store(self, tmp_path):
            return lambda: MyStore(tmp_path / "state.db")

The suites need pytest (it is not a dependency of ``import statekeep``). See
``docs/extending.md`` for what each contract asks of a backend.
"""

import pkgutil

import pytest

# the suites' asserts should explain a failure the way a test module's do (every
# module of this package: the suites and the parts they are made of)
pytest.register_assert_rewrite(*(f"{__name__}.{m.name}" for m in pkgutil.iter_modules(__path__)))

from statekeep.testing._context_kit import ContextStoreFactory  # noqa: E402
from statekeep.testing._memory_kit import MemoryStoreFactory  # noqa: E402
from statekeep.testing._workflow_kit import WorkflowStoreFactory  # noqa: E402
from statekeep.testing.context import ContextStoreSuite  # noqa: E402
from statekeep.testing.memory import MemoryStoreSuite  # noqa: E402
from statekeep.testing.workflow import WorkflowStoreSuite  # noqa: E402
from statekeep.testing.working import WorkingStateStoreFactory, WorkingStateStoreSuite  # noqa: E402

__all__ = [
    "ContextStoreFactory",
    "ContextStoreSuite",
    "MemoryStoreFactory",
    "MemoryStoreSuite",
    "WorkflowStoreFactory",
    "WorkflowStoreSuite",
    "WorkingStateStoreFactory",
    "WorkingStateStoreSuite",
]
