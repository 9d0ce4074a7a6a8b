"""A real git server for tests: git's smart HTTP (``git http-backend``, a CGI program) behind
a small threaded WSGI server, with HTTP basic auth on the repositories it is told to protect.

    server = GitServer(root, host="0.0.0.0", protected={"private.git": ("alice", "s3cret")})
    server.start(); ... server.url("public.git") ...; server.stop()

Every request is recorded (method, path, status and the Authorization header as sent) so that
a test can check what a client sent, and where.
"""

from __future__ import annotations

import base64
import os
import shutil
import subprocess
import threading
from pathlib import Path
from socketserver import ThreadingMixIn
from wsgiref.simple_server import WSGIRequestHandler, WSGIServer, make_server

HTTP_BACKEND = "/usr/lib/git-core/git-http-backend"


def git_backend_available() -> bool:
    return os.access(HTTP_BACKEND, os.X_OK) and shutil.which("git") is not None


class _Server(ThreadingMixIn, WSGIServer):
    daemon_threads = True


class _QuietHandler(WSGIRequestHandler):
    def log_message(self, format, *args):  # noqa: A002 - the base class's name
        return


class GitServer:
    def __init__(
        self,
        root: Path,
        host: str = "127.0.0.1",
        port: int = 0,
        protected: dict[str, tuple[str, str]] | None = None,
        connect_host: str | None = None,
    ):
        self.root = Path(root)
        self.host = host
        self.connect_host = connect_host or host
        self.protected = dict(protected or {})
        self.requests: list[dict] = []
        self._server = make_server(host, port, self._app, _Server, _QuietHandler)
        self.port = self._server.server_address[1]
        self._thread: threading.Thread | None = None

    def url(self, repo: str) -> str:
        return f"http://{self.connect_host}:{self.port}/{repo}"

    def start(self) -> GitServer:
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        self._server.shutdown()
        self._server.server_close()

    def _authorized(self, path: str, header: str) -> bool:
        repo = path.lstrip("/").split("/", 1)[0]
        if repo not in self.protected:
            return True
        user, password = self.protected[repo]
        want = "Basic " + base64.b64encode(f"{user}:{password}".encode()).decode()
        return header == want

    def _app(self, environ, start_response):
        path = environ.get("PATH_INFO", "")
        auth = environ.get("HTTP_AUTHORIZATION", "")
        record = {"method": environ["REQUEST_METHOD"], "path": path, "authorization": auth}
        self.requests.append(record)
        if not self._authorized(path, auth):
            record["status"] = 401
            start_response(
                "401 Unauthorized",
                [("WWW-Authenticate", 'Basic realm="git"'), ("Content-Type", "text/plain")],
            )
            return [b"authentication required\n"]
        length = int(environ.get("CONTENT_LENGTH") or 0)
        body = environ["wsgi.input"].read(length) if length else b""
        env = {
            "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
            "GIT_PROJECT_ROOT": str(self.root),
            "GIT_HTTP_EXPORT_ALL": "1",
            "GATEWAY_INTERFACE": "CGI/1.1",
            "REQUEST_METHOD": environ["REQUEST_METHOD"],
            "PATH_INFO": path,
            "QUERY_STRING": environ.get("QUERY_STRING", ""),
            "CONTENT_TYPE": environ.get("CONTENT_TYPE", ""),
            "CONTENT_LENGTH": str(len(body)),
            "REMOTE_ADDR": environ.get("REMOTE_ADDR", ""),
            "REMOTE_USER": "user" if auth else "",
            "HOME": str(self.root),
        }
        if environ.get("HTTP_GIT_PROTOCOL"):
            env["GIT_PROTOCOL"] = environ["HTTP_GIT_PROTOCOL"]
        proc = subprocess.run(
            [HTTP_BACKEND], input=body, env=env, capture_output=True, timeout=60, check=False
        )
        head, _, payload = proc.stdout.partition(b"\r\n\r\n")
        if not _:
            head, _, payload = proc.stdout.partition(b"\n\n")
        status = "200 OK"
        headers = []
        for line in head.decode("latin-1").splitlines():
            name, _, value = line.partition(":")
            if name.lower() == "status":
                status = value.strip()
            elif name:
                headers.append((name.strip(), value.strip()))
        record["status"] = int(status.split()[0])
        start_response(status, headers)
        return [payload]


def git(*args: str, cwd: Path | None = None) -> str:
    """Run git with a fixed identity and no user or system configuration."""
    env = {
        "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
        "HOME": str(cwd or "/tmp"),
        "GIT_CONFIG_NOSYSTEM": "1",
        "GIT_CONFIG_GLOBAL": "/dev/null",
        "GIT_AUTHOR_NAME": "Test",
        "GIT_AUTHOR_EMAIL": "test@example.org",
        "GIT_COMMITTER_NAME": "Test",
        "GIT_COMMITTER_EMAIL": "test@example.org",
    }
    out = subprocess.run(
        ["git", *args], cwd=cwd, env=env, capture_output=True, text=True, check=True
    )
    return out.stdout.strip()
