"""``gpulab-sync``: pull or push one volume between object storage and a local directory,
or purge every object under a prefix.

    gpulab-sync pull  --bucket B [--prefix P] --local DIR [--delete] ...
    gpulab-sync push  --bucket B [--prefix P] --local DIR [--mode ro|rw|rwd] [--live] ...
    (pull and push: --exclude PATTERN, repeatable: paths left alone, see .exclude;
     --links: symbolic links kept as links, never followed)
    gpulab-sync purge --bucket B --prefix P ...   (an empty prefix is refused: exit 2)
    gpulab-sync git-clone --url URL --dest DIR ... (one git repository: see .gitclone)

Credentials come only from the environment (``AWS_ACCESS_KEY_ID``/``AWS_SECRET_ACCESS_KEY``)
or from ``--credentials-file`` (``--profile``; a session token is used); they are never
accepted on the command line nor printed. ``--ca-bundle`` verifies a store behind a private CA
(``--no-verify-tls``: no verification, a lab only).
``--store-endpoint file:///dir`` selects the embedded filesystem store.

With ``--json-progress``, stdout carries one JSON object per line (``"event": "progress"``,
then a final ``"event": "report"``), each flushed as soon as it is written so that a reader
following the output (e.g. ``docker logs --follow``) sees it live.

Exit codes: 0 all objects synced, 1 some objects failed, 2 bad usage or configuration.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING
from urllib.parse import urlsplit

from gpulab.volumes import VolumeError, validate_bucket_name

from .credentials import Credentials, CredentialsError, ca_bundle_problem
from .models import SyncProgress, SyncReport
from .s3_settings import MiB, S3Settings

if TYPE_CHECKING:
    from .backend import Remote

# The engine (and boto3) are imported in main(), once the arguments are checked.

EXIT_OK, EXIT_FAILED, EXIT_USAGE = 0, 1, 2
log = logging.getLogger("gpulab.datasync")


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="gpulab-sync",
        description="Incremental, verified sync between an object store bucket and a directory.",
        epilog="Credentials: AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY in the environment, "
        "or --credentials-file. Exit codes: 0 ok, 1 some objects failed, 2 bad usage/config.",
    )
    p.add_argument("operation", choices=("pull", "push", "purge"))
    p.add_argument("--local", type=Path, help="local directory (pull and push)")
    p.add_argument("--bucket", required=True, help="bucket (container) name")
    p.add_argument(
        "--prefix",
        default="",
        help="key prefix to sync (default: whole bucket); purge: the prefix whose objects "
        "are all deleted (required, never empty)",
    )
    p.add_argument(
        "--store-endpoint",
        default=None,
        help="S3 endpoint URL (default: AWS), or file:///dir for the filesystem store",
    )
    p.add_argument("--region", default="us-east-1")
    p.add_argument(
        "--mode",
        choices=("ro", "rw", "rwd"),
        default="rw",
        help="push: rw uploads additions/changes, rwd also deletes, ro pushes nothing",
    )
    p.add_argument(
        "--delete",
        action="store_true",
        help="pull: remove local files whose remote object was deleted since the last sync",
    )
    p.add_argument("--credentials-file", type=Path, help="AWS credentials file or KEY=VALUE file")
    p.add_argument(
        "--profile",
        default=None,
        help="the profile of --credentials-file to use ([NAME] or [profile NAME]; "
        "default: [default])",
    )
    tls = p.add_mutually_exclusive_group()
    tls.add_argument(
        "--ca-bundle",
        type=Path,
        default=None,
        help="PEM file of the CAs that sign the store's TLS certificate (a private CA)",
    )
    tls.add_argument(
        "--no-verify-tls",
        action="store_true",
        help="do not verify the store's TLS certificate (a lab only)",
    )
    p.add_argument(
        "--max-bytes",
        type=int,
        default=None,
        help="pull: refuse (before downloading anything) when the objects under the prefix "
        "weigh more than this many bytes together (a disk quota's booking); push: refuse "
        "(before uploading or deleting anything) when the local files weigh more (a cap)",
    )
    p.add_argument(
        "--exclude",
        action="append",
        default=[],
        metavar="PATTERN",
        help="a path to leave alone in both directions (repeatable; gitignore-like: "
        "'__pycache__/' at any depth, '.cache/' at the root, a trailing / for directories): "
        "neither transferred nor deleted on either side",
    )
    p.add_argument(
        "--links",
        action="store_true",
        help="pull and push: keep symbolic links (pushed as objects holding their target, "
        "restored as links; never followed); without it they are skipped",
    )
    p.add_argument(
        "--live",
        action="store_true",
        help="push: the workload is running and may be writing; take only files unchanged "
        "for --settle-seconds and unchanged while read, and delete nothing (even rwd)",
    )
    p.add_argument(
        "--settle-seconds",
        type=float,
        default=None,
        help="push --live: seconds a file must have been unchanged to be taken (default 10)",
    )
    p.add_argument(
        "--wait-lock",
        type=float,
        default=0.0,
        help="seconds to wait for another sync of the same directory to end (default 0: "
        "fail at once)",
    )
    p.add_argument("--json-progress", action="store_true", help="print JSON lines on stdout")
    p.add_argument("--workers", type=int, default=16, help="objects in flight (default 16)")
    p.add_argument("--retry-mode", choices=("standard", "adaptive"), default="standard")
    p.add_argument("--max-attempts", type=int, default=5, help="attempts per request")
    defaults = S3Settings()
    p.add_argument(
        "--multipart-threshold-mib",
        type=int,
        default=defaults.multipart_threshold // MiB,
        help="objects this large or larger use ranged/multipart transfers "
        f"(default {defaults.multipart_threshold // MiB})",
    )
    p.add_argument(
        "--multipart-chunksize-mib",
        type=int,
        default=defaults.multipart_chunksize // MiB,
        help=f"part size of those transfers (default {defaults.multipart_chunksize // MiB})",
    )
    p.add_argument("--connect-timeout", type=float, default=5.0)
    p.add_argument("--read-timeout", type=float, default=60.0)
    return p


class UsageError(Exception):
    """Bad configuration (exit code 2)."""


def _remote(args: argparse.Namespace) -> Remote:
    endpoint = args.store_endpoint
    if endpoint and endpoint.startswith("file://"):
        from .filesystem import FilesystemRemote

        root = urlsplit(endpoint).path
        if not root.startswith("/"):
            raise UsageError("a file:// store endpoint needs an absolute path")
        return FilesystemRemote(root, args.bucket)
    if endpoint and not (endpoint.startswith(("http://", "https://")) and "@" not in endpoint):
        raise UsageError("--store-endpoint must be http(s)://host[:port] (no credentials in it)")
    try:
        if args.credentials_file:
            creds = Credentials.from_file(args.credentials_file, args.profile)
        else:
            creds = Credentials.from_env()
    except CredentialsError as exc:
        raise UsageError(str(exc)) from None
    if creds is None:
        raise UsageError(
            "no credentials: set AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY, "
            "or pass --credentials-file"
        )
    verify: bool | str = not args.no_verify_tls
    if args.ca_bundle is not None:
        problem = ca_bundle_problem(args.ca_bundle)
        if problem:
            raise UsageError(f"--ca-bundle: {problem}")
        verify = str(args.ca_bundle)
    if min(args.multipart_threshold_mib, args.multipart_chunksize_mib) < 5:
        raise UsageError("multipart threshold and chunk size must be at least 5 MiB")
    settings = S3Settings(
        retry_mode=args.retry_mode,
        max_attempts=args.max_attempts,
        max_pool_connections=args.workers + 16,
        connect_timeout=args.connect_timeout,
        read_timeout=args.read_timeout,
        multipart_threshold=args.multipart_threshold_mib * MiB,
        multipart_chunksize=args.multipart_chunksize_mib * MiB,
    )
    from .s3 import S3Remote

    return S3Remote(
        args.bucket,
        endpoint_url=endpoint,
        region=args.region,
        credentials=creds,
        settings=settings,
        verify=verify,
    )


def _print_json(data: dict) -> None:
    """One JSON object per line, flushed at once (stdout may be a pipe or a log driver)."""
    sys.stdout.write(json.dumps(data) + "\n")
    sys.stdout.flush()


def _summary(report: SyncReport) -> str:
    if report.operation == "purge":
        return (
            f"purge {report.bucket}/{report.prefix}: {report.deleted} deleted, "
            f"{report.failed} failed of {report.objects_total} in {report.elapsed_s:.2f} s"
        )
    flux = f", {report.in_flux} in flux (left for the next push)" if report.live else ""
    return (
        f"{report.operation} {report.bucket}/{report.prefix}: {report.completed} transferred, "
        f"{report.skipped} unchanged, {report.deleted} deleted, {report.failed} failed of "
        f"{report.objects_total} ({report.bytes_transferred} bytes in {report.elapsed_s:.2f} s)"
        f"{flux}"
    )


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of ``gpulab-sync``; returns the exit code."""
    logging.basicConfig(level=logging.WARNING, format="gpulab-sync: %(levelname)s %(message)s")
    # line-buffered even when stdout is a pipe: progress is read live by other processes
    with contextlib.suppress(AttributeError, ValueError):
        sys.stdout.reconfigure(line_buffering=True)  # type: ignore[union-attr]
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["git-clone"]:  # a job's git source (gpulab.jobs.supervisor.git_sources)
        from .gitclone import main as git_clone

        return git_clone(argv[1:])
    args = _parser().parse_args(argv)
    from .manifest import Locked

    try:
        validate_bucket_name(args.bucket)
        if args.workers < 1 or args.max_attempts < 1:
            raise UsageError("--workers and --max-attempts must be at least 1")
        if args.max_bytes is not None and args.max_bytes < 0:
            raise UsageError("--max-bytes must not be negative")
        if args.live and args.operation != "push":
            raise UsageError("--live is for push only")
        if args.settle_seconds is not None and not (args.live and args.settle_seconds >= 0):
            raise UsageError("--settle-seconds needs --live and a number of seconds >= 0")
        if not 0 <= args.wait_lock <= 3600:
            raise UsageError("--wait-lock must be between 0 and 3600 seconds")
        if args.operation == "purge":
            if not args.prefix.strip("/"):
                raise UsageError(
                    "purge needs a non-empty --prefix (refusing to delete a whole bucket)"
                )
        elif args.local is None:
            raise UsageError(f"{args.operation} needs --local DIR")
        remote = _remote(args)
        from .engine import SyncOptions, pull, push
        from .exclude import Excludes

        exclude = Excludes(args.exclude)
        from .purging import purge

        on_progress = None
        if args.json_progress:

            def on_progress(p: SyncProgress) -> None:
                _print_json(p.to_dict())

        options = SyncOptions(workers=args.workers)
        if args.operation == "purge":
            report = purge(remote, args.prefix, progress=on_progress, options=options)
        elif args.operation == "pull":
            report = pull(
                remote,
                args.local,
                args.prefix,
                delete=args.delete,
                progress=on_progress,
                options=options,
                max_bytes=args.max_bytes,
                exclude=exclude,
                links=args.links,
                wait_lock_s=args.wait_lock,
            )
        else:
            report = push(
                args.local,
                remote,
                args.prefix,
                args.mode,
                progress=on_progress,
                options=options,
                max_bytes=args.max_bytes,
                exclude=exclude,
                live=args.live,
                wait_lock_s=args.wait_lock,
                links=args.links,
                **({} if args.settle_seconds is None else {"settle_s": args.settle_seconds}),
            )
    except (UsageError, VolumeError, Locked, FileNotFoundError, ValueError) as exc:
        print(f"gpulab-sync: error: {exc}", file=sys.stderr)
        return EXIT_USAGE
    if args.json_progress:
        _print_json(report.to_dict())
    else:
        print(_summary(report))
        for failure in report.failures:
            print(f"gpulab-sync: failed {failure.key}: {failure.reason}", file=sys.stderr)
    return EXIT_OK if report.ok else EXIT_FAILED


if __name__ == "__main__":
    sys.exit(main())
