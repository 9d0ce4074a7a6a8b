"""A pull given up while the engine sends nothing (a registry that stalled) frees its thread
at once (runtime/pulls.py GiveUp): a real docker-py client against a local engine stand-in
that answers /images/create with one progress message and then holds the call open."""

from __future__ import annotations

import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import docker
import pytest

from gpulab.runtime.base import ImagePullFailed
from gpulab.runtime.pulls import GiveUp, pull_blocking


class Stalling(BaseHTTPRequestHandler):
    released = threading.Event()

    def do_POST(self):  # noqa: N802 - http.server's name
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Transfer-Encoding", "chunked")
        self.end_headers()
        line = json.dumps({"status": "Pulling fs layer", "id": "l1"}).encode() + b"\r\n"
        self.wfile.write(b"%x\r\n%s\r\n" % (len(line), line))
        self.wfile.flush()
        self.released.wait(30)  # the registry stalls: nothing more, the call held open

    def log_message(self, *args):
        pass


@pytest.fixture
def stalling_engine():
    server = ThreadingHTTPServer(("127.0.0.1", 0), Stalling)
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"tcp://127.0.0.1:{server.server_address[1]}"
    Stalling.released.set()
    server.shutdown()


def test_a_pull_given_up_while_the_engine_sends_nothing_frees_its_thread(stalling_engine):
    client = docker.APIClient(base_url=stalling_engine, version="1.43")
    given_up, seen, outcome = GiveUp(), [], []

    def pull():
        try:
            pull_blocking(
                client, "reg.example/x@sha256:" + "a" * 64, None, seen.append, 0, given_up
            )
        except ImagePullFailed as e:
            outcome.append(str(e))

    thread = threading.Thread(target=pull, daemon=True)
    thread.start()
    deadline = time.monotonic() + 10
    while not seen and time.monotonic() < deadline:
        time.sleep(0.02)
    assert seen, "the first progress message"
    time.sleep(0.3)
    assert thread.is_alive()  # held by the stalled call
    given_up.set()  # the caller's time-out
    thread.join(5)
    assert not thread.is_alive(), "the thread is still held by the stalled call"
    assert outcome == ["the pull was given up (image_pull_timeout)"]
