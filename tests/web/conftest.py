"""The webhook tests use the workflow store's fixtures."""

from tests.workflow.conftest import make_engine

__all__ = ["make_engine"]
