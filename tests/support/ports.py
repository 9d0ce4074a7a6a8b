"""Free loopback ports for test servers.

The kernel may hand the same ephemeral port to two ``bind(0)`` calls once the first socket is
closed, so picking a hub's four ports one after the other could give two of them the same
number (a CI run lost a browser module to exactly that: the proxy and the gpulab service both
got 41239). Every port handed out here is remembered for the life of the test process and
never handed out again.
"""

from __future__ import annotations

import socket
import threading

_given: set[int] = set()
_lock = threading.Lock()


def free_port() -> int:
    """A loopback TCP port that is free now and that this process has not handed out before."""
    with _lock:
        for _ in range(100):
            with socket.socket() as s:
                s.bind(("127.0.0.1", 0))
                port = s.getsockname()[1]
            if port not in _given:
                _given.add(port)
                return port
    raise RuntimeError("no fresh free port after 100 tries")
