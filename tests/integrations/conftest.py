"""The integrations need their frameworks (the ``langgraph`` and ``agents`` extras, in ``dev``)."""

from pathlib import Path

import pytest


@pytest.fixture(autouse=True)
def _statekeep_home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Settings read from the environment (a session's default key ring) stay in the test's folder."""
    monkeypatch.setenv("STATEKEEP_HOME", str(tmp_path / "statekeep-home"))
