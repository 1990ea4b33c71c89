"""``Worker``: one daemon thread that runs blocking calls in order for the event loop.

Why not a ``concurrent.futures`` executor: its threads are joined at interpreter exit, so one
NVML or amdsmi call that never returns (a GPU fallen off the bus) would hang the process on
SIGTERM.  A daemon thread that nobody joins lets the exporter exit; a hung call blocks only the
worker of its own source, and the next call is not queued behind it (the runner reports the
source down instead).
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable
from queue import SimpleQueue
from typing import Any


class Worker:
    """One daemon thread running blocking calls in order; a hung call blocks only this worker."""

    def __init__(self, name: str):
        self._queue: SimpleQueue[tuple[Callable[[], Any], asyncio.Future, asyncio.AbstractEventLoop] | None] = SimpleQueue()
        self.busy = False
        self._thread = threading.Thread(target=self._run, name=f"source-{name}", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while True:
            item = self._queue.get()
            if item is None:
                return
            fn, fut, loop = item
            try:
                result = fn()
            except BaseException as exc:  # noqa: BLE001 - handed to the awaiting task
                self._deliver(loop, _set_exc, fut, exc)
            else:
                self._deliver(loop, _set_result, fut, result)
            finally:
                self.busy = False

    @staticmethod
    def _deliver(loop: asyncio.AbstractEventLoop, setter: Callable, fut: asyncio.Future, value: Any) -> None:
        try:
            loop.call_soon_threadsafe(setter, fut, value)
        except RuntimeError:
            pass  # the loop closed while a hung call was running: nobody waits for it any more

    def submit(self, fn: Callable[[], Any]) -> asyncio.Future:
        loop = asyncio.get_running_loop()
        fut = loop.create_future()
        # a result nobody awaits any more (the call timed out) is still retrieved, so asyncio
        # never logs "Future exception was never retrieved" with the whole error in it
        fut.add_done_callback(_retrieve)
        self.busy = True
        self._queue.put((fn, fut, loop))
        return fut

    def stop(self) -> None:
        self._queue.put(None)


def _retrieve(fut: asyncio.Future) -> None:
    if not fut.cancelled():
        fut.exception()


def _set_result(fut: asyncio.Future, value: Any) -> None:
    if not fut.done():
        fut.set_result(value)


def _set_exc(fut: asyncio.Future, exc: BaseException) -> None:
    if not fut.done():
        fut.set_exception(exc)
