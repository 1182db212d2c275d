"""The webhook tests use the workflow store's fixtures, and the runtime's settings for agent runs."""

from tests.runtime.conftest import settings
from tests.workflow.conftest import make_engine

__all__ = ["make_engine", "settings"]
