"""AWS Signature Version 4 for the direct S3 GETs (header form), standard library only.

botocore's ``S3SigV4Auth`` computes the same signature (``tests/unit`` checks the two agree
header for header); this one is a few lines of standard library with no request object to
build per GET. Requests are signed as
botocore signs them for S3 with payload signing disabled: every header given is signed, the
path and query are used as sent (S3 does not normalize paths) and the payload hash is
``UNSIGNED-PAYLOAD`` for bodies, the hash of nothing otherwise.
"""

from __future__ import annotations

import datetime
import hashlib
import hmac
from dataclasses import dataclass, field
from urllib.parse import urlsplit

from .credentials import Credentials

UNSIGNED_PAYLOAD = "UNSIGNED-PAYLOAD"
EMPTY_SHA256 = hashlib.sha256(b"").hexdigest()
_UNSIGNED_HEADERS = frozenset({"expect", "user-agent", "x-amzn-trace-id"})  # as botocore
_DEFAULT_PORTS = {"http": 80, "https": 443}


def host_header(url: str) -> str:
    """The Host header for ``url``: lowercase, without a default port."""
    parts = urlsplit(url)
    host = parts.hostname or ""
    if ":" in host:  # an IPv6 literal
        host = f"[{host}]"
    if parts.port is not None and parts.port != _DEFAULT_PORTS.get(parts.scheme):
        host = f"{host}:{parts.port}"
    return host


def _hmac(key: bytes, msg: str) -> bytes:
    return hmac.digest(key, msg.encode(), "sha256")


def signer_for(credentials: Credentials | None, region: str) -> SigV4Signer | None:
    """The signer for ``credentials`` in ``region``; None for anonymous requests."""
    if credentials is None:
        return None
    return SigV4Signer(
        credentials.access_key_id,
        credentials.secret_access_key,
        credentials.session_token,
        region=region,
    )


@dataclass
class SigV4Signer:
    """Signs requests to one region's S3 with one set of credentials."""

    access_key_id: str
    secret_access_key: str = field(repr=False)
    session_token: str | None = field(default=None, repr=False)
    region: str = "us-east-1"
    service: str = "s3"
    # the signing key is derived once per day (four HMACs less per request)
    _key: tuple[str, bytes] = field(default=("", b""), init=False, repr=False)

    def _signing_key(self, day: str) -> bytes:
        if self._key[0] != day:
            k = _hmac(f"AWS4{self.secret_access_key}".encode(), day)
            for part in (self.region, self.service, "aws4_request"):
                k = _hmac(k, part)
            self._key = (day, k)
        return self._key[1]

    def sign(
        self,
        method: str,
        host: str,
        path_and_query: str,
        headers: dict[str, str],
        *,
        has_body: bool = False,
        now: datetime.datetime | None = None,
    ) -> dict[str, str]:
        """The headers to send: ``headers`` plus X-Amz-Date, X-Amz-Content-SHA256, the
        session token if any, and Authorization. ``path_and_query`` is what goes on the
        request line, already percent-encoded (query pairs with ``urlencode(...,
        quote_via=quote)``)."""
        when = now or datetime.datetime.now(datetime.UTC)
        stamp = when.strftime("%Y%m%dT%H%M%SZ")
        day = stamp[:8]
        out = {k: v for k, v in headers.items() if k.lower() != "authorization"}
        out["X-Amz-Date"] = stamp
        if self.session_token:
            out["X-Amz-Security-Token"] = self.session_token
        payload = UNSIGNED_PAYLOAD if has_body else EMPTY_SHA256
        out["X-Amz-Content-SHA256"] = payload

        signed: dict[str, list[str]] = {}
        for name, value in out.items():
            low = name.lower()
            if low not in _UNSIGNED_HEADERS:
                signed.setdefault(low, []).append(" ".join(value.split()))
        signed.setdefault("host", [host])
        names = sorted(signed)
        path, _, query = path_and_query.partition("?")
        canonical_query = "&".join(
            f"{k}={v}" for k, _, v in sorted(p.partition("=") for p in query.split("&") if p)
        )
        canonical = "\n".join(
            [
                method.upper(),
                path,
                canonical_query,
                "".join(f"{n}:{','.join(signed[n])}\n" for n in names),
                ";".join(names),
                payload,
            ]
        )
        scope = f"{day}/{self.region}/{self.service}/aws4_request"
        to_sign = "\n".join(
            ["AWS4-HMAC-SHA256", stamp, scope, hashlib.sha256(canonical.encode()).hexdigest()]
        )
        signature = hmac.new(self._signing_key(day), to_sign.encode(), "sha256").hexdigest()
        out["Authorization"] = (
            f"AWS4-HMAC-SHA256 Credential={self.access_key_id}/{scope}, "
            f"SignedHeaders={';'.join(names)}, Signature={signature}"
        )
        return out
