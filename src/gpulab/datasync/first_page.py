"""A pull's first listing page, asked for before the rest of ``gpulab-sync`` has loaded.

When nothing changed under a prefix, a pull is one listing: the store answers for 5,000 keys
in 0.6 s (moto here), while loading the engine and its libraries (botocore, urllib3) takes
0.15 s of CPU. Sent first, from a thread, the request is answered while the program loads.

This is a head start only, loaded with the standard library and :mod:`.sigv4`: anything but
a page or the refusal of its size (a 400, which the engine answers by asking for 1,000 keys a
page) is dropped, and the engine asks again through its own client, so retries, error
reports and fallbacks stay the engine's.
"""

from __future__ import annotations

import http.client
import os
import threading
from urllib.parse import quote, urlencode, urlsplit

from .credentials import Credentials
from .sigv4 import SigV4Signer, host_header, signer_for

#: the most keys S3 returns in one listing page (and its default)
S3_PAGE = 1000


def list_query(prefix: str, page_size: int, token: str | None = None) -> dict[str, str]:
    """The query of a ListObjectsV2 page (keys URL-encoded by the server, as boto3 asks too,
    so that any key survives XML)."""
    query = {"list-type": "2", "prefix": prefix, "encoding-type": "url"}
    if page_size != S3_PAGE:
        query["max-keys"] = str(page_size)
    if token:
        query["continuation-token"] = token
    return query


def encode_query(query: dict[str, str]) -> str:
    """``query`` sorted and percent-encoded as SigV4 signs it (``/`` included)."""
    return urlencode(sorted(query.items()), quote_via=quote)


def bucket_path(endpoint_url: str, bucket: str) -> str:
    """The path of ``bucket`` on a path-style endpoint."""
    return f"{urlsplit(endpoint_url).path.rstrip('/')}/{quote(bucket, safe='')}"


def _tls_context() -> object:
    import ssl

    cafile = os.environ.get("AWS_CA_BUNDLE")
    if not cafile:
        try:
            import certifi  # what botocore trusts when it is installed

            cafile = certifi.where()
        except ImportError:
            cafile = None
    return ssl.create_default_context(cafile=cafile)


class FirstPage:
    """The first ListObjectsV2 page of ``bucket``/``prefix``, fetched in a daemon thread."""

    def __init__(
        self,
        endpoint_url: str,
        bucket: str,
        prefix: str,
        *,
        region: str,
        credentials: Credentials | None,
        page_size: int,
        connect_timeout: float,
        read_timeout: float,
    ) -> None:
        self.bucket, self.prefix, self.page_size = bucket, prefix, page_size
        self._answer: tuple[int, bytes] | None = None
        self._taken = False
        self._done = threading.Event()
        args = (endpoint_url, signer_for(credentials, region), connect_timeout, read_timeout)
        threading.Thread(target=self._fetch, args=args, name="first-page", daemon=True).start()

    def _fetch(
        self, endpoint_url: str, signer: SigV4Signer | None, connect_s: float, read_s: float
    ) -> None:
        try:
            parts = urlsplit(endpoint_url)
            url = bucket_path(endpoint_url, self.bucket)
            url += "?" + encode_query(list_query(self.prefix, self.page_size))
            headers: dict[str, str] = {}
            if signer is not None:
                headers = signer.sign("GET", host_header(endpoint_url), url, headers)
            conn: http.client.HTTPConnection
            if parts.scheme == "https":
                conn = http.client.HTTPSConnection(
                    parts.hostname or "", parts.port, timeout=connect_s, context=_tls_context()
                )
            else:
                conn = http.client.HTTPConnection(
                    parts.hostname or "", parts.port, timeout=connect_s
                )
            try:
                conn.connect()
                if conn.sock is not None:
                    conn.sock.settimeout(read_s)
                conn.request("GET", url, headers=headers)
                resp = conn.getresponse()
                self._answer = (resp.status, resp.read())
            finally:
                conn.close()
        except Exception:  # noqa: BLE001 - a head start only: the engine asks again
            self._answer = None
        finally:
            self._done.set()

    def wait(self) -> tuple[int, bytes] | None:
        """The answer, (status, body), once it is in; None if the request failed."""
        self._done.wait()
        return self._answer

    def take(self, bucket: str, prefix: str, page_size: int) -> tuple[int, bytes] | None:
        """The answer, (status, body), if this page is the first of that listing; once."""
        if self._taken or (bucket, prefix, page_size) != (
            self.bucket,
            self.prefix,
            self.page_size,
        ):
            return None
        self._taken = True
        return self.wait()
