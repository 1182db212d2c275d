"""The event loop on which the runtime awaits async models and tools, outside ``arun``/``astream``."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Coroutine
from typing import Any, TypeVar

T = TypeVar("T")


class ModelLoop:
    """One event loop, on a daemon thread, that runs every call of an async model or tool.

    ``asyncio.run`` per call would fail inside a running loop (a notebook) and
    would close the loop an async HTTP client is bound to after each call.
    Here the caller's thread blocks on the call, whatever loop it runs, and the
    loop lives until the runtime is closed. (``arun`` and ``astream`` await on
    the caller's own loop instead.)
    """

    def __init__(self) -> None:
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()

    def run(self, coroutine: Coroutine[Any, Any, T]) -> T:
        """Run ``coroutine`` on the loop and wait for its result (cancelled if the wait is interrupted)."""
        with self._lock:
            if self._loop is None:
                self._loop = asyncio.new_event_loop()
                self._thread = threading.Thread(
                    target=self._loop.run_forever, name="statekeep-async-model", daemon=True
                )
                self._thread.start()
            future = asyncio.run_coroutine_threadsafe(coroutine, self._loop)
        try:
            return future.result()
        except BaseException:
            future.cancel()
            raise

    def close(self) -> None:
        """Stop the loop and its thread (a later call starts new ones)."""
        with self._lock:
            loop, thread, self._loop, self._thread = self._loop, self._thread, None, None
        if loop is not None and thread is not None:
            loop.call_soon_threadsafe(loop.stop)
            thread.join()
            loop.close()
