"""Containers' exits as the engine announces them: one stream of Docker's ``die`` and
``destroy`` events, followed by a thread of its own, wakes whoever waits for a container to
end (the job supervisor's watch) at once, instead of at its next pass.

The events are a hint, never the truth: a waiter that wakes reads the container's state from
the engine as before, and one that hears nothing reads it anyway every so often (a stream that
broke, an engine restarted: the thread connects again, and what died meanwhile is found by
that look). A waiter says since when it has looked (``since``, ``time.monotonic()`` before its
look): an exit announced after that wakes it, even one announced before it began to wait.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections import OrderedDict
from collections.abc import Sequence

log = logging.getLogger(__name__)

#: names whose last exit is remembered (the oldest forgotten first): far more than the
#: containers that end within one watch pass
REMEMBERED = 4096
#: seconds before a broken stream is followed again
RECONNECT_AFTER = 1.0


class ExitEvents:
    """Follows one engine's container exits (``client``: a docker-py ``APIClient``)."""

    def __init__(self, client) -> None:
        self.client = client
        #: name -> time.monotonic() of its last announced exit
        self.exited: OrderedDict[str, float] = OrderedDict()
        self._waiters: dict[str, set[asyncio.Future]] = {}
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._stream = None
        self._stopped = threading.Event()
        #: the stream is connected now (else waiters get nothing early: they look anyway)
        self.following = False

    def start(self, loop: asyncio.AbstractEventLoop) -> None:
        """Follow the engine's events (once), announcing them on ``loop`` (the latest
        caller's: a waiter waits on its own loop)."""
        self._loop = loop
        if self._thread is not None:
            return
        self._thread = threading.Thread(target=self._follow, name="gpulab-exits", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stopped.set()
        stream = self._stream
        if stream is not None:
            stream.close()

    def _follow(self) -> None:
        while not self._stopped.is_set():
            try:
                self._stream = self.client.events(
                    decode=True, filters={"type": "container", "event": ["die", "destroy"]}
                )
                self.following = True
                for event in self._stream:
                    name = ((event.get("Actor") or {}).get("Attributes") or {}).get("name")
                    loop = self._loop
                    if name and loop is not None and not loop.is_closed():
                        loop.call_soon_threadsafe(self.announce, name, time.monotonic())
            except Exception as e:  # noqa: BLE001 - the engine went away: follow again
                if not self._stopped.is_set():
                    log.debug("container exit events: %s; following again", e)
            finally:
                self.following = False
            self._stopped.wait(RECONNECT_AFTER)

    def announce(self, name: str, at: float) -> None:
        """``name``'s container exited (or went) at ``at``: its waiters wake (event loop)."""
        self.exited[name] = at
        self.exited.move_to_end(name)
        while len(self.exited) > REMEMBERED:
            self.exited.popitem(last=False)
        for waiter in self._waiters.pop(name, ()):
            if not waiter.done():
                waiter.set_result(True)

    async def wait(self, names: Sequence[str], timeout: float, since: float) -> bool:
        """True as soon as one of ``names`` exited after ``since``; False after ``timeout``."""
        if any(self.exited.get(n, -1.0) >= since for n in names):
            return True
        waiter = asyncio.get_running_loop().create_future()
        for n in names:
            self._waiters.setdefault(n, set()).add(waiter)
        try:
            return await asyncio.wait_for(asyncio.shield(waiter), timeout)
        except TimeoutError:
            return False
        finally:
            for n in names:
                held = self._waiters.get(n)
                if held is not None:
                    held.discard(waiter)
                    if not held:
                        del self._waiters[n]
