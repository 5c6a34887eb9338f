"""The camera lanes awaited from an event loop (the encode stage, stages/encode.py).

A lane thread wakes the loop (one ``call_soon_threadsafe``) only when the loop waits for results and
``batch`` of them are ready, or on an error: at most one wake per ``batch`` frames while the encoders are the
bottleneck. Apart from stages/encode_lanes.py so that the lanes' blocking users (a worker's thread, the encoder
process) do not import an event loop.
"""

from __future__ import annotations

import asyncio
import functools
from collections.abc import Callable, Mapping

import anyio
import anyio.from_thread

from demoforge.stages.encode_lanes import Encoder, LaneSet
from demoforge.stages.records import CameraTail


class _Waker:
    """Wakes the event loop from a lane thread without waiting for it (asyncio: ``call_soon_threadsafe``;
    other anyio backends: a blocking ``from_thread.run_sync``)."""

    def __init__(self) -> None:
        try:
            self._loop: asyncio.AbstractEventLoop | None = asyncio.get_running_loop()
        except RuntimeError:
            self._loop = None
        self._token = anyio.lowlevel.current_token()

    def __call__(self, event: anyio.Event) -> None:
        try:
            if self._loop is not None:
                self._loop.call_soon_threadsafe(event.set)
            else:
                anyio.from_thread.run_sync(event.set, token=self._token)
        except RuntimeError:  # the loop is gone: nobody waits any more
            pass


class AsyncLaneSet(LaneSet):
    """:class:`LaneSet` whose results an event loop awaits; the loop-side methods never block it."""

    def __init__(self, makers: Mapping[str, Callable[[], Encoder]], batch: int = 4) -> None:
        super().__init__(makers)
        self.batch = max(1, batch)  # results ready before a waiting loop is woken (or a failure)
        self._waker: _Waker | None = None  # made by the first wait, on its event loop

    async def next_result(self) -> dict[str, bytes | CameraTail | None]:
        """The next job's result of every lane, in submission order; waits (for a batch) if not ready."""
        event: anyio.Event | None = None
        with self.lock:
            self._raise_if_failed()
            if self._ready() == 0:
                if self._waker is None:
                    self._waker = _Waker()
                event = anyio.Event()
                self._want = min(self.batch, self._submitted - self._taken)
                self._notify = functools.partial(self._waker, event)
        if event is not None:
            try:
                await event.wait()
            finally:
                with self.lock:
                    self._want = self._notify = None
            with self.lock:
                self._raise_if_failed()
        with self.lock:
            return self._take()

    async def close(self) -> None:
        """Stop every lane (each aborts the encoders it still holds) and wait for their threads."""
        with anyio.CancelScope(shield=True):
            await anyio.to_thread.run_sync(self.shutdown)
