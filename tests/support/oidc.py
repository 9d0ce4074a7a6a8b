"""A small OAuth2 / OpenID Connect provider for the log-in tests, served from a thread of the
test process on a free port of 127.0.0.1: a user signs in at the provider (``/login``, a
session cookie), ``/authorize`` sends the browser back to the client's redirect URI with a
one-time code, ``/token`` trades the code (and the client's secret) for an access token, and
``/userinfo`` says who the token's user is, with their ``groups`` claim. Everything a real
provider does for the authorization-code flow, nothing more (no discovery, no signed ID
token: GenericOAuthenticator reads ``userdata_url``)."""

from __future__ import annotations

import base64
import json
import secrets
import threading
from dataclasses import dataclass, field
from http.cookies import SimpleCookie
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import parse_qs, urlencode, urlparse

import requests

from .ports import free_port

#: user -> (password, groups)
ACCOUNTS = {
    "alice": ("alice-pw-1", ["gpulab-users"]),
    "stranger": ("stranger-pw-2", ["somewhere-else"]),  # an account of the provider, not ours
    "admin": ("admin-pw-3", ["gpulab-users"]),
    "carol": ("carol-pw-4", ["gpulab-admins"]),
}
CLIENT_ID = "gpulab"
#: the shipped OpenID Connect site file (docs/site-examples/oidc.py), which this provider fits
EXAMPLE = Path(__file__).resolve().parents[2] / "docs" / "site-examples" / "oidc.py"
SESSION = "test-idp-session"


@dataclass
class Provider:
    client_secret: str = field(default_factory=lambda: secrets.token_urlsafe(16))
    port: int = field(default_factory=free_port)
    sessions: dict[str, str] = field(default_factory=dict)  # cookie -> user
    codes: dict[str, tuple[str, str]] = field(default_factory=dict)  # code -> (user, redirect)
    tokens: dict[str, str] = field(default_factory=dict)  # access token -> user
    server: ThreadingHTTPServer | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> Provider:
        provider = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args):  # quiet
                pass

            def _answer(self, status: int, body: dict | str = "", headers=()) -> None:
                data = json.dumps(body) if isinstance(body, dict) else body
                self.send_response(status)
                for k, v in headers:
                    self.send_header(k, v)
                ctype = "application/json" if isinstance(body, dict) else "text/plain"
                self.send_header("Content-Type", ctype)
                self.send_header("Content-Length", str(len(data.encode())))
                self.end_headers()
                self.wfile.write(data.encode())

            def _form(self) -> dict[str, str]:
                length = int(self.headers.get("Content-Length") or 0)
                raw = self.rfile.read(length).decode()
                return {k: v[0] for k, v in parse_qs(raw).items()}

            def do_GET(self):
                url = urlparse(self.path)
                query = {k: v[0] for k, v in parse_qs(url.query).items()}
                if url.path == "/authorize":
                    return self._authorize(query)
                if url.path == "/userinfo":
                    return self._userinfo()
                self._answer(404, "no such page")

            def do_POST(self):
                url = urlparse(self.path)
                if url.path == "/login":
                    return self._login(self._form())
                if url.path == "/token":
                    return self._token(self._form())
                self._answer(404, "no such page")

            def _login(self, form):
                account = ACCOUNTS.get(form.get("username", ""))
                if account is None or account[0] != form.get("password"):
                    return self._answer(401, "wrong user name or password")
                cookie = secrets.token_urlsafe(16)
                provider.sessions[cookie] = form["username"]
                self._answer(200, "signed in", [("Set-Cookie", f"{SESSION}={cookie}; Path=/")])

            def _authorize(self, query):
                if query.get("client_id") != CLIENT_ID or query.get("response_type") != "code":
                    return self._answer(400, "unknown client or response type")
                jar = SimpleCookie(self.headers.get("Cookie", ""))
                user = provider.sessions.get(jar[SESSION].value) if SESSION in jar else None
                if user is None:
                    return self._answer(401, "sign in at the provider first")
                code = secrets.token_urlsafe(16)
                provider.codes[code] = (user, query["redirect_uri"])
                back = {"code": code, "state": query.get("state", "")}
                self._answer(302, "", [("Location", f"{query['redirect_uri']}?{urlencode(back)}")])

            def _token(self, form):
                client = (form.get("client_id"), form.get("client_secret"))
                auth = self.headers.get("Authorization", "")
                if auth.startswith("Basic "):
                    client = tuple(base64.b64decode(auth[6:]).decode().split(":", 1))
                if client != (CLIENT_ID, provider.client_secret):
                    return self._answer(401, {"error": "invalid_client"})
                user, redirect = provider.codes.pop(form.get("code", ""), (None, None))
                if user is None or form.get("redirect_uri") != redirect:
                    return self._answer(400, {"error": "invalid_grant"})
                token = secrets.token_urlsafe(24)
                provider.tokens[token] = user
                self._answer(200, {"access_token": token, "token_type": "Bearer"})

            def _userinfo(self):
                auth = self.headers.get("Authorization", "")
                user = provider.tokens.get(auth.removeprefix("Bearer ").strip())
                if user is None:
                    return self._answer(401, {"error": "invalid_token"})
                groups = ACCOUNTS[user][1]
                self._answer(
                    200, {"sub": f"id-{user}", "preferred_username": user, "groups": groups}
                )

        self.server = ThreadingHTTPServer(("127.0.0.1", self.port), Handler)
        threading.Thread(target=self.server.serve_forever, daemon=True).start()
        return self

    def stop(self) -> None:
        if self.server is not None:
            self.server.shutdown()
            self.server.server_close()

    def site_file(self, hub) -> str:
        """The shipped site file, pointed at this provider and at ``hub``'s own address (its
        client secret: GPULAB_OAUTH_CLIENT_SECRET in the hub's environment)."""
        return (
            f"load_subconfig({str(EXAMPLE)!r})\n"
            'c.GpulabSettings.public_url = ""\n'
            f'c.GenericOAuthenticator.oauth_callback_url = "{hub.url}/hub/oauth_callback"\n'
            f'c.GenericOAuthenticator.authorize_url = "{self.url}/authorize"\n'
            f'c.GenericOAuthenticator.token_url = "{self.url}/token"\n'
            f'c.GenericOAuthenticator.userdata_url = "{self.url}/userinfo"\n'
        )

    def login_through(self, hub, user: str) -> tuple[requests.Session, requests.Response]:
        """Sign in at the provider as ``user``, then log in to the hub as a browser does (the
        hub's /hub/oauth_login, the provider's consent, the hub's callback): the session and
        the last answer (a refused log-in is the callback's 403)."""
        s = requests.Session()
        r = s.post(
            f"{self.url}/login",
            data={"username": user, "password": ACCOUNTS[user][0]},
            timeout=30,
        )
        r.raise_for_status()
        return s, s.get(f"{hub.url}/hub/oauth_login", timeout=60)
