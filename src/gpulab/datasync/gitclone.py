"""``gpulab-sync git-clone``: clone one git repository into a directory, in the sync helper.

    gpulab-sync git-clone --url URL [--branch B | --revision R] --dest DIR [--replace]
                          [--timeout SECONDS] [--max-bytes BYTES] [--quota-bytes BYTES]

The job supervisor runs this in a short-lived helper container (the sync image, never the
user's image) that mounts one job volume at ``--dest``; the job's container mounts the same
volume at the path the user chose (see :mod:`gpulab.jobs.supervisor.git_sources`). It speaks
git's smart HTTP through dulwich (pure Python, no ``git`` binary, no hooks, no filters, no
submodules).

- What is checked out: ``--branch`` (HEAD on that branch, like ``git clone -b``), or
  ``--revision`` (a tag, a full ref name ``refs/...``, a branch name, or a commit hash; HEAD
  detached), or neither (the remote's default branch). Shallow (depth 1) when the revision is a
  ref or a full hash the server lets us fetch; an abbreviated hash, or a full one the server
  refuses to send alone, takes a full fetch.
- Credentials: the files ``git-username`` and ``git-password`` in ``--credentials-dir``
  (``/run/secrets``, where gpulab hands a helper its secret files), never the environment or
  the command line, so that an inspection of the helper shows none; they are sent only to
  the URL's own origin (dulwich drops them on a redirect elsewhere), never written to the
  clone's config, and every message printed is scrubbed of them and of any
  ``user:password@`` in a URL.
- Safety of the checkout: dulwich refuses paths with ``..`` or ``.git`` components and any
  path whose leading directory is a symbolic link (git's own rule, CVE-2021-21300), so nothing
  is written outside ``--dest``; links themselves are created as links, as git does.
- Caps: ``--max-bytes`` on the pack received and, separately, on the files checked out;
  ``--quota-bytes`` on the two together (what the owner's disk quota booked for this clone);
  ``--timeout`` on the whole clone. All are enforced while the data arrives. A repository over
  a cap fails with the cap in the reason (and ``"limit": "cap"`` or ``"quota"``).
- ``--dest`` must be empty, unless ``--replace`` says it is the clone's own volume: a volume
  that already holds a finished clone of the same URL and revision (a job started again on the
  same node) is then kept as it is, with whatever the job changed there, and anything else in
  it (a clone cut short) is removed first. A failed clone leaves ``--dest`` empty.

Output: one JSON line, ``{"event": "git", "ok": true, "url": ..., "ref": ..., "commit": ...,
"files": N, "bytes": N, "disk_bytes": N, "shallow": bool, "kept": bool}`` (``disk_bytes``: the
pack received and the files checked out) or ``{"event": "git", "ok": false, "url": ..., "ref":
..., "reason": ..., "limit": "cap" | "quota" | null}``. Exit codes: 0 cloned, 1 failed, 2 bad usage.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import os
import re
import shutil
import signal
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from urllib.parse import urlsplit

EXIT_OK, EXIT_FAILED, EXIT_USAGE = 0, 1, 2
#: the credential's files, in the directory the helper is handed its secret files in
USERNAME_FILE, PASSWORD_FILE = "git-username", "git-password"
CREDENTIALS_DIR = Path("/run/secrets")
GiB = 1024**3
#: defaults of the caps (the supervisor may pass others)
DEFAULT_TIMEOUT = 1800.0
DEFAULT_MAX_BYTES = 10 * GiB
#: seconds one HTTP request may wait for the server (connect and each read)
HTTP_TIMEOUT = 60.0
#: written in the clone's .git once it is complete: what a later run may keep
MARKER = "gpulab-clone.json"
_HEX = re.compile(r"[0-9a-fA-F]{4,64}")
_USERINFO = re.compile(r"(?i)\b([a-z][a-z0-9+.-]*://)[^/\s@]*@")


class CloneFailed(Exception):
    """The clone cannot be done; the message says why, for the user (never the credential).
    ``limit``: "cap" or "quota" when the repository was over ``--max-bytes`` or
    ``--quota-bytes``."""

    def __init__(self, message: str, limit: str | None = None):
        super().__init__(message)
        self.limit = limit


class _Usage:
    """Bytes the clone has put on disk so far: the pack of the current fetch and the files
    checked out; over ``quota`` (pack and files together) it stops."""

    def __init__(self, quota: int | None):
        self.quota = quota
        self.pack = 0
        self.files = 0

    def check(self) -> None:
        if self.quota is not None and self.pack + self.files > self.quota:
            raise CloneFailed(
                f"the repository is larger than the {_size(self.quota)} your disk quota "
                "left for it",
                limit="quota",
            )


class _TimedOut(BaseException):
    """Raised by the alarm: a BaseException, so that no ``except Exception`` in a library
    swallows it."""


def scrub(text: str, secrets: Sequence[str] = ()) -> str:
    """``text`` without any ``user:password@`` in a URL nor any of ``secrets`` (as they are,
    and as an HTTP basic-auth value might carry them)."""
    text = _USERINFO.sub(r"\1", text)
    for s in secrets:
        if s:
            text = text.replace(s, "***")
    return text


def _auth_forms(username: str | None, password: str | None) -> list[str]:
    """The credential as it could appear in a message: the password, and the basic-auth
    header's base64 of ``user:password``."""
    import base64

    if not password:
        return []
    pair = base64.b64encode(f"{username or ''}:{password}".encode()).decode()
    return [password, pair]


def _size(n: int) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if n < 1024 or unit == "GiB":
            return f"{n} B" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n} B"


def _reason(exc: BaseException, host: str, has_credential: bool) -> str:
    """A user's words for why the clone failed (dulwich and urllib3 say it for programmers)."""
    from dulwich.client import HTTPUnauthorized
    from dulwich.errors import GitProtocolError, HangupException, NotGitRepository
    from dulwich.index import InvalidPathError

    if isinstance(exc, CloneFailed):
        return str(exc)
    if isinstance(exc, HTTPUnauthorized):
        if has_credential:
            return "authentication failed (HTTP 401): check the secret's user:password or token"
        return "the server asks for credentials (HTTP 401): give a secret with a token"
    if isinstance(exc, NotGitRepository):
        return (
            "no git repository at this URL (HTTP 404; a private repository answers so too "
            "without the right credentials)"
        )
    if isinstance(exc, InvalidPathError):
        return (
            f"the repository has an unsafe path ({exc}): it would write outside the checkout "
            "or into .git, so nothing was checked out"
        )
    if isinstance(exc, OSError) and exc.errno == 28:
        return "no space left on the node's disk"
    if isinstance(exc, HangupException):
        return f"the server hung up ({exc}): it may refuse this revision or be overloaded"
    if isinstance(exc, GitProtocolError):
        cause = exc.__cause__
        text = str(exc)
        m = re.match(r"unexpected http resp (\d+)", text)
        if m:
            code = m.group(1)
            if code == "403":
                return "access denied (HTTP 403): the credential may lack read access"
            return f"the server answered HTTP {code}"
        if cause is not None:
            return _network_reason(cause, host)
        return f"git protocol error: {text}"
    return f"{type(exc).__name__}: {exc}"


def _network_reason(exc: BaseException, host: str) -> str:
    """urllib3's MaxRetryError(...(Caused by NewConnectionError(...))) in a few words."""
    reason = getattr(exc, "reason", None) or exc
    name = type(reason).__name__
    text = str(reason)
    if "NameResolution" in name or "Name or service not known" in text:
        return f"host {host} not found (DNS)"
    if "refused" in text.lower():
        return f"cannot connect to {host}: connection refused"
    if "Timeout" in name or "timed out" in text:
        return f"{host} did not answer in time"
    if "SSL" in name or "certificate" in text.lower():
        return f"TLS error with {host}: {text.rsplit(':', 1)[-1].strip()[:200]}"
    return f"cannot reach {host}: {text[:200]}"


# --- the volume -------------------------------------------------------------------------------


def _read_marker(dest: Path) -> dict | None:
    try:
        data = json.loads((dest / ".git" / MARKER).read_text())
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def _writable_retry(func, path, exc_info) -> None:
    """shutil.rmtree's error handler: a directory the job made read-only (its owner is the
    helper's user too) is made writable, and the removal tried once more."""
    parent = os.path.dirname(path)
    if not isinstance(exc_info[1], PermissionError) or os.path.islink(parent):
        raise exc_info[1]
    os.chmod(parent, 0o700)
    func(path)


def _empty(dest: Path) -> None:
    """Remove everything in ``dest`` (not ``dest`` itself: it is the volume's root), following
    no link (shutil.rmtree on Linux works through directory descriptors)."""
    for child in os.scandir(dest):
        p = dest / child.name
        if child.is_dir(follow_symlinks=False):
            shutil.rmtree(p, onerror=_writable_retry)
        else:
            p.unlink()


# --- what to fetch ----------------------------------------------------------------------------


def _pick(refs: dict, symrefs: dict, branch: str | None, revision: str | None):
    """(ref to create or None, sha to fetch or None, prefix to resolve or None, words).

    From the advertised refs: a branch, a tag or full ref, a branch named as a revision, a
    full hash (maybe not advertised), or an abbreviated one (resolved after a full fetch)."""
    names = sorted(r.decode(errors="replace") for r in refs if not r.endswith(b"^{}"))
    if not names:
        raise CloneFailed("the repository is empty (it has no branch or tag)")
    if branch is not None:
        ref = f"refs/heads/{branch}".encode()
        if ref not in refs:
            have = [n[len("refs/heads/") :] for n in names if n.startswith("refs/heads/")]
            raise CloneFailed(
                f"branch {branch!r} not found (branches: {', '.join(have[:10]) or 'none'}"
                f"{', ...' if len(have) > 10 else ''})"
            )
        return ref, refs[ref], None, f"branch {branch}"
    if revision is None:
        head = symrefs.get(b"HEAD")
        if head and head in refs:
            return head, refs[head], None, f"branch {head.decode()[len('refs/heads/') :]}"
        if b"HEAD" in refs:
            return None, refs[b"HEAD"], None, "HEAD"
        raise CloneFailed("the repository has no default branch: give a branch or revision")
    candidates = [revision] if revision.startswith("refs/") else []
    candidates += [f"refs/tags/{revision}", f"refs/heads/{revision}"]
    for c in candidates:
        ref = c.encode()
        if ref in refs:
            return ref, refs[ref], None, f"revision {revision}"
    if _HEX.fullmatch(revision):
        rev = revision.lower()
        if len(rev) in (40, 64):
            return None, rev.encode(), None, f"revision {revision}"
        return None, None, rev, f"revision {revision}"
    raise CloneFailed(
        f"revision {revision!r} not found: no such tag, branch or ref, and not a commit hash"
    )


def _capped_fetch_pack(client, max_bytes: int, usage: _Usage | None = None) -> None:
    """Make ``client`` refuse a pack over ``max_bytes`` (or over what ``usage`` leaves) while
    it arrives (not after)."""
    original = client.fetch_pack
    usage = usage or _Usage(None)

    def fetch_pack(path, determine_wants, graph_walker, pack_data, *args, **kwargs):
        received = 0
        usage.pack = 0  # a fetch after a failed shallow one starts from an empty directory

        def write(data: bytes):
            nonlocal received
            received += len(data)
            usage.pack = received
            if received > max_bytes:
                raise CloneFailed(
                    f"the repository is larger than the limit of {_size(max_bytes)}", limit="cap"
                )
            usage.check()
            return pack_data(data)

        return original(path, determine_wants, graph_walker, write, *args, **kwargs)

    client.fetch_pack = fetch_pack


class _CheckoutCap:
    """A dulwich blob normalizer that only counts: the checkout stops at ``max_bytes``."""

    def __init__(self, max_bytes: int, usage: _Usage | None = None):
        self.max_bytes = max_bytes
        self.usage = usage or _Usage(None)
        self.files = 0
        self.bytes = 0

    def checkout_normalize(self, blob, path):
        self.files += 1
        self.bytes += blob.raw_length()
        if self.bytes > self.max_bytes:
            raise CloneFailed(
                f"the checked-out files are larger than the limit of {_size(self.max_bytes)}",
                limit="cap",
            )
        self.usage.files = self.bytes
        self.usage.check()
        return blob

    def checkin_normalize(self, blob, path):  # pragma: no cover - never checks in
        return blob


def clone(
    url: str,
    dest: Path,
    branch: str | None = None,
    revision: str | None = None,
    username: str | None = None,
    password: str | None = None,
    max_bytes: int = DEFAULT_MAX_BYTES,
    replace: bool = False,
    quota_bytes: int | None = None,
) -> dict:
    """Clone ``url`` into the directory ``dest``, which must exist and be empty, unless
    ``replace`` says that it is the clone's own volume, whose content may go; the result's
    fields (commit, files, bytes...). Raises CloneFailed or dulwich's and urllib3's errors."""
    from dulwich.client import HttpGitClient
    from dulwich.index import build_index_from_tree, validate_path_element_default
    from dulwich.objects import Commit, Tag
    from dulwich.objectspec import parse_commit
    from dulwich.repo import Repo

    parts = urlsplit(url)
    if parts.scheme.lower() not in ("http", "https") or not parts.hostname:
        raise CloneFailed("only http:// and https:// URLs can be cloned")
    if "@" in parts.netloc:
        raise CloneFailed("the URL must not carry a user name or password")
    if any(c.isspace() or ord(c) < 0x20 or ord(c) == 0x7F for c in url):
        # it is written into the clone's .git/config: no line breaks, no control characters
        raise CloneFailed("the URL must not contain spaces or control characters")
    base_url = f"{parts.scheme.lower()}://{parts.netloc}/"
    client = HttpGitClient(
        base_url,
        username=(username or "x-access-token") if password else None,
        password=password or None,
        timeout=HTTP_TIMEOUT,
    )
    usage = _Usage(quota_bytes)
    _capped_fetch_pack(client, max_bytes, usage)
    path = parts.path or "/"

    # a finished clone of the same source (the job started again on this node) stays as the
    # job left it, and needs no server: the job's inputs do not change under it
    wanted = {"url": url, "branch": branch, "revision": revision}
    found = _read_marker(dest)
    if found and {k: found.get(k) for k in wanted} == wanted and found.get("commit"):
        return {"commit": found["commit"], "kept": True, "disk_bytes": found.get("disk_bytes", 0)}
    if any(os.scandir(dest)):
        if not replace:
            raise CloneFailed(f"{dest} is not empty (--replace if it is the clone's own volume)")
        _empty(dest)

    listing = client.get_refs(path)
    refs, symrefs = dict(listing.refs), dict(listing.symrefs)
    ref, sha, prefix, words = _pick(refs, symrefs, branch, revision)

    repo = Repo.init(str(dest), mkdir=False)
    try:
        shallow = False
        if sha is not None:
            try:
                client.fetch(path, repo, determine_wants=lambda r, depth=None: [sha], depth=1)
                shallow = True
            except CloneFailed:
                raise
            except Exception:
                if ref is not None:
                    raise  # an advertised ref that cannot be fetched: the server's fault
                # a commit the server will not send alone (not a ref's tip): everything
                repo.close()
                _empty(dest)
                repo = Repo.init(str(dest), mkdir=False)
        if not shallow:
            client.fetch(path, repo)
            if sha is not None and sha not in repo.object_store:
                raise CloneFailed(f"revision {revision!r} not found in the repository")
        if prefix is not None:
            try:
                sha = parse_commit(repo, prefix.encode()).id
            except (KeyError, ValueError) as e:
                raise CloneFailed(f"revision {revision!r} not found ({e})") from None
        obj = repo.object_store[sha]
        while isinstance(obj, Tag):
            obj = repo.object_store[obj.object[1]]
        if not isinstance(obj, Commit):
            raise CloneFailed(f"{words} is a {obj.type_name.decode()}, not a commit")
        commit = obj.id

        config = repo.get_config()
        config.set((b"remote", b"origin"), b"url", url.encode())
        config.set((b"remote", b"origin"), b"fetch", b"+refs/heads/*:refs/remotes/origin/*")
        if ref is not None and ref.startswith(b"refs/heads/") and revision is None:
            name = ref[len(b"refs/heads/") :]
            repo.refs[ref] = commit
            repo.refs[b"refs/remotes/origin/" + name] = commit
            repo.refs.set_symbolic_ref(b"HEAD", ref)
            config.set((b"branch", name), b"remote", b"origin")
            config.set((b"branch", name), b"merge", ref)
        else:
            if ref is not None and ref.startswith(b"refs/tags/"):
                repo.refs[ref] = sha
            del repo.refs[b"HEAD"]
            repo.refs[b"HEAD"] = commit
        config.write_to_path()

        cap = _CheckoutCap(max_bytes, usage)
        build_index_from_tree(
            repo.path,
            repo.index_path(),
            repo.object_store,
            obj.tree,
            honor_filemode=True,
            validate_path_element=validate_path_element_default,
            blob_normalizer=cap,
        )
    finally:
        repo.close()
    result = {
        "ref": words,
        "commit": commit.decode(),
        "files": cap.files,
        "bytes": cap.bytes,
        "disk_bytes": usage.pack + usage.files,
        "shallow": shallow,
        "kept": False,
    }
    marker = {**wanted, "commit": result["commit"], "disk_bytes": result["disk_bytes"]}
    (dest / ".git" / MARKER).write_text(json.dumps(marker))
    return result


# --- the command ------------------------------------------------------------------------------


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="gpulab-sync git-clone",
        description="Clone one git repository (smart HTTP) into a directory.",
        epilog=f"Credentials: the files {USERNAME_FILE} and {PASSWORD_FILE} in the credentials "
        "directory, if there. Exit codes: 0 cloned, 1 failed, 2 bad usage.",
    )
    p.add_argument("--url", required=True, help="https:// or http:// URL of the repository")
    which = p.add_mutually_exclusive_group()
    which.add_argument("--branch", help="branch to check out (default: the remote's default)")
    which.add_argument("--revision", help="tag, commit hash or refs/... to check out, detached")
    p.add_argument("--dest", type=Path, required=True, help="existing directory to clone into")
    p.add_argument(
        "--credentials-dir",
        type=Path,
        default=CREDENTIALS_DIR,
        help=f"where the files {USERNAME_FILE} and {PASSWORD_FILE} are (default: %(default)s)",
    )
    p.add_argument(
        "--replace",
        action="store_true",
        help="DEST is this clone's own volume: what is in it (a clone cut short) may be removed",
    )
    p.add_argument("--timeout", type=float, default=DEFAULT_TIMEOUT, help="seconds in all")
    p.add_argument(
        "--max-bytes", type=int, default=DEFAULT_MAX_BYTES, help="cap on the pack and the files"
    )
    p.add_argument(
        "--quota-bytes",
        type=int,
        default=None,
        help="cap on the pack and the files together (what the disk quota booked for it)",
    )
    return p


def _credential(path: Path) -> str | None:
    """A credential file's value (its text without the line end); None where there is none."""
    try:
        return path.read_text().rstrip("\r\n") or None
    except FileNotFoundError:
        return None


def _print(event: dict) -> None:
    print(json.dumps(event), flush=True)


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of ``gpulab-sync git-clone``; prints one JSON line, returns the exit code."""
    # dulwich and urllib3 log URLs and server answers: nothing of theirs is printed
    logging.getLogger("dulwich").setLevel(logging.CRITICAL)
    logging.getLogger("urllib3").setLevel(logging.CRITICAL)
    args = _parser().parse_args(argv)
    username = _credential(args.credentials_dir / USERNAME_FILE)
    password = _credential(args.credentials_dir / PASSWORD_FILE)
    secrets = _auth_forms(username, password)
    url = scrub(args.url, secrets)
    words = (
        f"branch {args.branch}"
        if args.branch
        else f"revision {args.revision}"
        if args.revision
        else "the default branch"
    )
    quota_ok = args.quota_bytes is None or args.quota_bytes > 0
    if not args.dest.is_dir() or args.timeout <= 0 or args.max_bytes <= 0 or not quota_ok:
        print(
            "gpulab-sync git-clone: error: --dest must be an existing directory, --timeout, "
            "--max-bytes and --quota-bytes positive",
            file=sys.stderr,
        )
        return EXIT_USAGE
    try:
        import dulwich  # noqa: F401 - in the sync image; a plain gpulab install lacks it
    except ImportError:
        print("gpulab-sync git-clone: error: dulwich is not installed", file=sys.stderr)
        return EXIT_USAGE
    host = urlsplit(args.url).hostname or "?"
    started_empty = not any(os.scandir(args.dest))

    def alarm(signum, frame):
        raise _TimedOut

    signal.signal(signal.SIGALRM, alarm)
    signal.setitimer(signal.ITIMER_REAL, args.timeout)
    started = time.monotonic()
    try:
        result = clone(
            args.url,
            args.dest,
            args.branch,
            args.revision,
            username,
            password,
            args.max_bytes,
            args.replace,
            args.quota_bytes,
        )
    except _TimedOut:
        reason = f"timed out after {args.timeout:g} s"
        limit = None
    except BaseException as exc:  # every failure is reported, none with a traceback
        if isinstance(exc, KeyboardInterrupt | SystemExit):
            raise
        reason = _reason(exc, host, bool(password))
        limit = exc.limit if isinstance(exc, CloneFailed) else None
    else:
        signal.setitimer(signal.ITIMER_REAL, 0)
        _print(
            {
                "event": "git",
                "ok": True,
                "url": url,
                "ref": words,
                **result,
                "elapsed_s": round(time.monotonic() - started, 3),
            }
        )
        return EXIT_OK
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
    if args.replace or started_empty:
        with contextlib.suppress(OSError):
            _empty(args.dest)  # half a clone is no input: the next run starts clean
    _print(
        {
            "event": "git",
            "ok": False,
            "url": url,
            "ref": words,
            "reason": scrub(reason, secrets),
            "limit": limit,
        }
    )
    return EXIT_FAILED


if __name__ == "__main__":
    sys.exit(main())
