"""``python -m gpulab.admin backup|restore ...`` (also ``gpulab admin ...``): see :mod:`.backup`."""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

from .backup import BackupError, KeyPlace, Source, backup, key_advice, restore

CONFIG_HELP = (
    "the hub's jupyterhub_config.py (default: $GPULAB_CONFIG_FILE, else ./jupyterhub_config.py)"
)


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        prog="gpulab admin",
        description="An operator's commands on the hub's host: back up and restore the hub's "
        "and gpulab's databases, upgrade gpulab's schema (docs/upgrading.md).",
        epilog="Exit status: 0 done, 1 refused or failed (the reason on stderr), 2 bad usage.",
    )
    actions = p.add_subparsers(dest="action", metavar="ACTION", required=True)
    b = actions.add_parser(
        "backup",
        help="a consistent copy of both databases while everything runs",
        description="Copy the hub's database (JupyterHub.db_url) and gpulab's (database_url) "
        "into the new directory DEST while the hub, the service and the workloads run: SQLite "
        "through its online backup API, PostgreSQL with pg_dump; then a manifest.json. The "
        "secrets key stays out unless --with-key: keep it apart from the backups.",
    )
    b.add_argument("dest", metavar="DEST", help="a new (or empty) directory")
    b.add_argument("--config", metavar="FILE", help=CONFIG_HELP)
    b.add_argument(
        "--with-key",
        action="store_true",
        help="copy the secrets key (secrets_key_file) into the backup too",
    )
    r = actions.add_parser(
        "restore",
        help="put a backup back into a fresh data directory",
        description="Restore the backup SRC into DATA_DIR, which must be new or empty: SQLite "
        "databases become DATA_DIR/jupyterhub.sqlite and DATA_DIR/gpulab.sqlite (as "
        "jupyterhub_config.py names them); a PostgreSQL dump loads into the empty database "
        "--hub-db / --gpulab-db names. Then point the hub at DATA_DIR (GPULAB_DATA_DIR or "
        "c.GpulabSettings.data_dir) and start it.",
    )
    r.add_argument("src", metavar="SRC", help="a directory `gpulab admin backup` wrote")
    r.add_argument("data_dir", metavar="DATA_DIR", help="the new data directory")
    r.add_argument("--key", metavar="FILE", help="the kept secrets key, copied to DATA_DIR")
    r.add_argument("--hub-db", metavar="URL", help="where the hub's database goes")
    r.add_argument("--gpulab-db", metavar="URL", help="where gpulab's database goes")
    u = actions.add_parser(
        "upgrade-db",
        help="bring gpulab's database to this gpulab's schema (take a backup first)",
        description="Run the schema revisions gpulab's database (database_url) lacks, as "
        "`jupyterhub upgrade-db` does for the hub's: the hub and the service refuse to start "
        "on an older schema until it has run. Stop the hub first, and back up. The hub's own "
        "database is JupyterHub's: `jupyterhub upgrade-db` upgrades it.",
    )
    u.add_argument("--config", metavar="FILE", help=CONFIG_HELP)
    return p.parse_args(argv)


def sources(config_file: str | None) -> tuple[list[Source], KeyPlace]:
    """The two databases and the key, as the hub's configuration names them."""
    from ..settings import GpulabSettings, load_config

    path = config_file or os.environ.get("GPULAB_CONFIG_FILE") or "jupyterhub_config.py"
    if not Path(path).is_file():
        raise BackupError(f"no configuration file {path} (--config FILE)")
    try:
        config = load_config(str(Path(path).resolve()))
        settings = GpulabSettings(config=config)
    except SystemExit as e:
        raise BackupError(f"{path}: {e.code}") from None
    hub_url = config.JupyterHub.get("db_url") if "JupyterHub" in config else None
    found = [
        Source("hub", str(hub_url or "sqlite:///jupyterhub.sqlite")),
        Source("gpulab", settings.database_url),
    ]
    keys = KeyPlace(settings.secrets_key_file, bool([k for k in settings.secrets_keys if k]))
    return found, keys


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    try:
        if args.action == "backup":
            found, keys = sources(args.config)
            manifest = backup(Path(args.dest), found, keys, args.with_key)
            for role, entry in manifest["databases"].items():
                print(f"{role} database {entry['source']} -> {Path(args.dest) / entry['file']}")
            print(f"manifest: {Path(args.dest) / 'manifest.json'}")
            print(key_advice(manifest))
            revision = manifest["databases"]["gpulab"]["revision"]
            print(f"gpulab {manifest['gpulab_version']}, schema revision {revision or 'none'}")
        elif args.action == "upgrade-db":
            from ..db import SchemaMismatch, shown_url, upgrade_database

            found, _keys = sources(args.config)
            url = found[1].url
            try:
                was, now = upgrade_database(url)
            except SchemaMismatch as e:
                raise BackupError(str(e)) from None
            step = f"{now}, current" if was == now else f"{was or 'none'} -> {now}"
            print(f"gpulab's database {shown_url(url)}: schema revision {step}")
        else:
            targets = {"hub": args.hub_db or "", "gpulab": args.gpulab_db or ""}
            key = Path(args.key) if args.key else None
            for line in restore(Path(args.src), Path(args.data_dir), targets, key):
                print(line)
    except BackupError as e:
        print(f"gpulab admin: {e}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
