"""Free loopback ports for test servers.

Two hazards, both seen in CI:

- the kernel may hand the same ephemeral port to two ``bind(0)`` calls once the first socket
  is closed, so picking a hub's four ports one after the other could give two of them the same
  number (a CI run lost a browser module to exactly that: the proxy and the gpulab service
  both got 41239);
- two test processes (pytest-xdist's workers, or the swarm pass beside them) each asked the
  kernel and could be given the same port: a hub then started behind another worker's proxy,
  and its admin token was refused there ("Missing or invalid credentials").

So ports come from below the kernel's ephemeral range (which outgoing connections and
Docker's published ports draw from), in a band of their own for each test process
(``PYTEST_XDIST_WORKER``; ``GPULAB_TEST_PORT_BAND`` for a process beside the workers), are
checked free by binding them, and are never handed out twice by one process.
"""

from __future__ import annotations

import os
import random
import socket
import threading

_given: set[int] = set()
_lock = threading.Lock()

#: the ports the bands share: below Linux's default ephemeral range (32768-60999)
LOW, HIGH = 12000, 32000
BANDS = 8


def band() -> int:
    """This process's band: 1 + the xdist worker's number, 0 for a process without xdist
    (``GPULAB_TEST_PORT_BAND`` overrides, for a second pytest process run beside others)."""
    if os.environ.get("GPULAB_TEST_PORT_BAND"):
        return int(os.environ["GPULAB_TEST_PORT_BAND"]) % BANDS
    worker = os.environ.get("PYTEST_XDIST_WORKER", "")
    return (int(worker[2:]) + 1) % BANDS if worker.startswith("gw") else 0


def band_range(n: int) -> range:
    size = (HIGH - LOW) // BANDS
    return range(LOW + n * size, LOW + (n + 1) * size)


def _free(port: int) -> bool:
    with socket.socket() as s:
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def free_port() -> int:
    """A loopback TCP port of this process's band that is free now and that this process has
    not handed out before."""
    ports = band_range(band())
    with _lock:
        for _ in range(200):
            port = random.choice(ports)
            if port not in _given and _free(port):
                _given.add(port)
                return port
    raise RuntimeError(f"no fresh free port in {ports} after 200 tries")
