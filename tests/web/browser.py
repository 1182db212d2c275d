"""A console served over real HTTP, and headless Chromium driving it (Debian's package, via Playwright).

Chromium is the system's (``make chromium`` installs Debian's package); Playwright
is pointed at it with ``executable_path`` and never downloads a browser. Screenshots
go to ``$STATEKEEP_SCREENSHOTS`` (default: ``<basetemp>/screenshots``); the ones in
docs/img/ were written by this test with ``STATEKEEP_SCREENSHOTS=docs/img``.
"""

from __future__ import annotations

import os
import shutil
import socket
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from statekeep.config import Settings

ROOT = Path(__file__).resolve().parents[2]


def chromium() -> str:
    """The system's Chromium, or the test fails saying how to install it."""
    found = shutil.which("chromium") or shutil.which("chromium-browser")
    if found is None:
        pytest.fail(
            "no chromium on PATH: `make chromium` installs Debian's package (apt-get install chromium)"
        )
    return found


class Server:
    """uvicorn serving ``app`` on a free port of 127.0.0.1, in a thread."""

    def __init__(self, app: Any) -> None:
        import uvicorn

        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.port = int(self.sock.getsockname()[1])
        self.url = f"http://127.0.0.1:{self.port}"
        config = uvicorn.Config(app, log_config=None, lifespan="off")
        self.server = uvicorn.Server(config)
        self.thread = threading.Thread(target=self.server.run, kwargs={"sockets": [self.sock]}, daemon=True)

    def __enter__(self) -> Server:
        self.thread.start()
        deadline = time.monotonic() + 30
        while not self.server.started:
            assert time.monotonic() < deadline, "the console did not start"
            time.sleep(0.02)
        return self

    def __exit__(self, *exc: object) -> None:
        self.server.should_exit = True
        self.thread.join(timeout=30)
        self.sock.close()


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    """One headless Chromium for the module's tests."""
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        launched = p.chromium.launch(executable_path=chromium(), args=["--no-sandbox"])
        yield launched
        launched.close()


@pytest.fixture
def shots(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Where the screenshots go."""
    folder = os.environ.get("STATEKEEP_SCREENSHOTS")
    path = Path(folder) if folder else tmp_path_factory.getbasetemp() / "screenshots"
    path.mkdir(parents=True, exist_ok=True)
    return path


def embedded_settings(tmp_path: Path) -> Settings:
    """SQLite and a LanceDB folder: the embedded default a person tries first."""
    return Settings.load(
        home=tmp_path / "home",
        database_url=f"sqlite:///{tmp_path / 'statekeep.db'}",
        memory_url=str(tmp_path / "memory"),
        env={},
    )
