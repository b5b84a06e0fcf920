"""A blocking iterator consumed from asyncio: the engine's decode loops are synchronous, the Serve methods async."""

from __future__ import annotations

import asyncio
import contextlib
import threading
from concurrent.futures import Executor
from typing import AsyncIterator, Callable, Iterator, TypeVar

T = TypeVar("T")
_DONE = object()


class _Failed:
    def __init__(self, error: BaseException):
        self.error = error


async def iterate_in_thread(iterator: Iterator[T], executor: Executor | None = None,
                            merge: Callable[[T, T], T] | None = None) -> AsyncIterator[T]:
    """Run ``iterator`` in a worker thread of ``executor`` and yield its items here as they come. Its exception is
    raised here. A consumer that stops early (``break``, ``aclose``, cancellation: a client that went away) stops
    the worker after the item in progress; the iterator's ``close()`` (a generator's ``finally``) runs in the worker
    in every case.

    ``merge(a, b)``: items that queued up while the consumer was busy are merged into one (in order) before they
    are yielded. A stream then costs one hop per item its consumer can take, not one per item made: under load a
    replica's 16 decodes make 16 items a step, and each item crossing Serve to the router and on to the client cost
    CPU the decodes needed. Alone, the consumer keeps up and every item goes on by itself."""
    loop = asyncio.get_running_loop()
    queue: asyncio.Queue = asyncio.Queue()
    stop = threading.Event()

    def put(item) -> None:
        with contextlib.suppress(RuntimeError):  # the loop closed (replica shutting down)
            loop.call_soon_threadsafe(queue.put_nowait, item)

    def work() -> None:
        try:
            for item in iterator:
                put(item)
                if stop.is_set():
                    break
        except BaseException as err:  # handed to the consumer
            put(_Failed(err))
        finally:
            close = getattr(iterator, "close", None)
            try:
                if close is not None:
                    close()
            finally:
                put(_DONE)

    loop.run_in_executor(executor, work)
    ended = None  # the end (or a failure) met while merging: handled after the merged item
    try:
        while (item := ended or await queue.get()) is not _DONE:
            ended = None
            if isinstance(item, _Failed):
                raise item.error
            while merge is not None and not queue.empty():
                more = queue.get_nowait()
                if more is _DONE or isinstance(more, _Failed):
                    ended = more
                    break
                item = merge(item, more)
            yield item
    finally:
        stop.set()
