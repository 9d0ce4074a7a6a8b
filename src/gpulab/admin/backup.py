"""A consistent online copy of the hub's and gpulab's databases, and its restore.

A backup is a directory of its own:

- ``jupyterhub.sqlite`` / ``gpulab.sqlite``: a SQLite database copied with SQLite's online
  backup API (one read transaction: a snapshot that writers in WAL mode go on beside), checked
  with ``PRAGMA integrity_check``; or ``jupyterhub.sql`` / ``gpulab.sql``: a PostgreSQL
  database as ``pg_dump`` writes it (one snapshot of its own, a plain SQL script);
- ``manifest.json``: when, by which gpulab and JupyterHub versions, each database's file,
  source (its URL, password hidden) and schema revision (``alembic_version``);
- ``secrets.key`` only when asked (``--with-key``): the key that decrypts users' secrets is
  kept apart from the backups by default, since whoever holds both reads every secret.

Restore makes a fresh data directory (refusing one that holds anything) with the SQLite files
under the names ``jupyterhub_config.py`` gives them, or loads a dump into an empty PostgreSQL
database with ``psql``; the kept key goes to ``DATA_DIR/secrets.key`` (mode 0600).
"""

from __future__ import annotations

import json
import os
import shutil
import sqlite3
import subprocess
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

from sqlalchemy.engine import URL, make_url

from .. import __version__
from ..db import shown_url

MANIFEST = "manifest.json"
KEY_FILE = "secrets.key"
#: the databases of a backup, by role, and the SQLite file each one has in a data directory
#: (the names jupyterhub_config.py gives them)
ROLES = {"hub": "jupyterhub", "gpulab": "gpulab"}
FORMAT = 1


class BackupError(Exception):
    """A backup or a restore cannot go on; the message says why and what to do."""


@dataclass(frozen=True)
class Source:
    """One database to back up: its role (``hub`` or ``gpulab``) and its SQLAlchemy URL."""

    role: str
    url: str


def _now() -> str:
    return datetime.now(UTC).replace(microsecond=0).isoformat().replace("+00:00", "Z")


def sqlite_path(url: str) -> Path | None:
    """The file of a SQLite URL, None for another database (or one in memory)."""
    parsed = make_url(url)
    if parsed.get_backend_name() != "sqlite":
        return None
    name = parsed.database or ""
    if not name or name == ":memory:" or name.startswith("file:"):
        raise BackupError(f"{shown_url(url)}: not a SQLite file that can be backed up")
    return Path(name)


def libpq(url: str) -> tuple[str, dict[str, str]]:
    """A PostgreSQL URL as libpq's tools take it (``postgresql://...``, no driver), and the
    environment that carries its password (never on a command line, where ps shows it)."""
    parsed: URL = make_url(url)
    env = {"PGPASSWORD": parsed.password} if parsed.password else {}
    plain = URL.create(
        "postgresql",
        username=parsed.username,
        host=parsed.host,
        port=parsed.port,
        database=parsed.database,
        query=parsed.query,
    )
    return plain.render_as_string(hide_password=False), env


def _run(argv: list[str], env: dict[str, str], what: str) -> str:
    try:
        done = subprocess.run(
            argv, env={**os.environ, **env}, capture_output=True, text=True, check=False
        )
    except FileNotFoundError:
        raise BackupError(
            f"{argv[0]} not found: {what} needs PostgreSQL's client programs "
            "(Debian: apt-get install postgresql-client)"
        ) from None
    if done.returncode != 0:
        raise BackupError(
            f"{what} failed ({argv[0]} exit {done.returncode}): {done.stderr.strip()}"
        )
    return done.stdout


# --- backup -------------------------------------------------------------------------------


def copy_sqlite(src: Path, dest: Path) -> None:
    """``src`` copied into the new file ``dest`` with SQLite's online backup API, in one step
    (one read transaction: a consistent snapshot, while the hub and the service write on), then
    made a self-contained file (rollback journal) and checked."""
    if not src.is_file():
        raise BackupError(f"no database file {src}")
    source = sqlite3.connect(src, timeout=30)
    target = sqlite3.connect(dest)
    try:
        source.backup(target)
        target.execute("PRAGMA journal_mode=DELETE")
        check = target.execute("PRAGMA integrity_check").fetchone()[0]
    finally:
        target.close()
        source.close()
    if check != "ok":
        raise BackupError(f"the copy of {src} fails SQLite's integrity check: {check}")


def sqlite_revision(path: Path) -> str | None:
    """The ``alembic_version`` of a SQLite file, None without one."""
    conn = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
    try:
        row = conn.execute("SELECT version_num FROM alembic_version").fetchone()
    except sqlite3.Error:
        return None
    finally:
        conn.close()
    return row[0] if row else None


def pg_revision(url: str) -> str | None:
    target, env = libpq(url)
    query = (
        "SELECT version_num FROM alembic_version WHERE to_regclass('alembic_version') IS NOT NULL"
    )
    try:
        out = _run(["psql", "-XtA", "-d", target, "-c", query], env, "reading the revision")
    except BackupError:
        return None
    return out.strip() or None


def dump_postgres(url: str, dest: Path) -> None:
    """``pg_dump`` of ``url`` into ``dest``: a plain SQL script, without owners or grants (so
    that it loads into a database of another role), from one snapshot of the database."""
    target, env = libpq(url)
    _run(
        ["pg_dump", "--no-owner", "--no-privileges", "--file", str(dest), "--dbname", target],
        env,
        f"pg_dump of {shown_url(url)}",
    )


@dataclass(frozen=True)
class KeyPlace:
    """Where the secrets key is: the file ``secrets_key_file`` names, and whether keys are
    written into the configuration itself (``secrets_keys``)."""

    file: str = ""
    in_config: bool = False


def backup(dest: Path, sources: list[Source], key: KeyPlace, with_key: bool) -> dict:
    """Back up ``sources`` into the new directory ``dest``; the manifest written there."""
    if dest.exists() and any(dest.iterdir()):
        raise BackupError(f"{dest} is not empty: a backup goes into a new directory")
    dest.mkdir(parents=True, exist_ok=True, mode=0o700)
    databases = {}
    for source in sources:
        base = ROLES[source.role]
        path = sqlite_path(source.url)
        if path is not None:
            name = f"{base}.sqlite"
            copy_sqlite(path, dest / name)
            revision = sqlite_revision(dest / name)
            kind = "sqlite"
        else:
            name = f"{base}.sql"
            revision = pg_revision(source.url)
            dump_postgres(source.url, dest / name)
            kind = "postgresql"
        (dest / name).chmod(0o600)
        databases[source.role] = {
            "kind": kind,
            "file": name,
            "source": shown_url(source.url),
            "revision": revision,
        }
    kept = None
    if with_key:
        if not key.file or not Path(key.file).is_file():
            raise BackupError(
                "--with-key: no secrets key file to copy (secrets_key_file names none, or it "
                "does not exist)"
            )
        shutil.copyfile(key.file, dest / KEY_FILE)
        (dest / KEY_FILE).chmod(0o600)
        kept = KEY_FILE
    manifest = {
        "format": FORMAT,
        "created": _now(),
        "gpulab_version": __version__,
        "jupyterhub_version": _jupyterhub_version(),
        "databases": databases,
        "secrets_key": {"file": kept, "kept_at": key.file or None, "in_config": key.in_config},
    }
    (dest / MANIFEST).write_text(json.dumps(manifest, indent=2) + "\n")
    return manifest


def _jupyterhub_version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("jupyterhub")
    except PackageNotFoundError:
        return ""


def key_advice(manifest: dict) -> str:
    """What the operator must do with the secrets key after a backup."""
    key = manifest["secrets_key"]
    if key["file"]:
        return (
            f"the secrets key is in this backup ({KEY_FILE}): whoever holds the backup can "
            "decrypt every user's secret; keep it as safe as the key itself"
        )
    where = key["kept_at"] or "(none: secrets_key_file names no file)"
    also = " and in the configuration (secrets_keys)" if key["in_config"] else ""
    return (
        f"the secrets key is NOT in this backup: it is {where}{also}. Keep a copy of it apart "
        "from the backups (without it the users' secrets cannot be decrypted; with it, "
        "whoever holds a backup reads them); --with-key copies it in"
    )


# --- restore ------------------------------------------------------------------------------


def read_manifest(src: Path) -> dict:
    try:
        manifest = json.loads((src / MANIFEST).read_text())
    except (OSError, ValueError) as e:
        raise BackupError(f"{src} is not a gpulab backup (no readable {MANIFEST}: {e})") from None
    if manifest.get("format") != FORMAT:
        raise BackupError(f"{src}: a backup of format {manifest.get('format')}, not {FORMAT}")
    return manifest


def _pg_is_empty(url: str) -> bool:
    target, env = libpq(url)
    query = "SELECT count(*) FROM pg_tables WHERE schemaname = 'public'"
    return (
        _run(["psql", "-XtA", "-d", target, "-c", query], env, "reading the target").strip() == "0"
    )


def restore(src: Path, data_dir: Path, targets: dict[str, str], key: Path | None) -> list[str]:
    """Restore the backup ``src`` into the fresh ``data_dir``: SQLite databases as files there
    (or where ``targets[role]``, a SQLite URL, says), a PostgreSQL dump into the empty database
    ``targets[role]`` names; the key (``key``, else the backup's own) as data_dir/secrets.key.
    Returns what was done, one line each."""
    manifest = read_manifest(src)
    if data_dir.exists() and any(data_dir.iterdir()):
        raise BackupError(f"{data_dir} is not empty: restore into a new data directory")
    plans = []
    for role, entry in manifest["databases"].items():
        file = src / entry["file"]
        if not file.is_file():
            raise BackupError(f"{file} is missing from the backup")
        url = targets.get(role) or ""
        if entry["kind"] == "sqlite":
            path = sqlite_path(url) if url else data_dir / f"{ROLES[role]}.sqlite"
            if path is None:
                raise BackupError(
                    f"the backup's {role} database is SQLite: it restores into a SQLite file, "
                    f"not {shown_url(url)}"
                )
            if path.exists():
                raise BackupError(f"{path} exists: restore into a new file")
            plans.append((role, "sqlite", file, str(path)))
        else:
            if not url or sqlite_path(url) is not None:
                raise BackupError(
                    f"the backup's {role} database is a PostgreSQL dump: name the empty "
                    f"PostgreSQL database to load it into (--{role}-db URL)"
                )
            if not _pg_is_empty(url):
                raise BackupError(f"{shown_url(url)} holds tables: restore into an empty database")
            plans.append((role, "postgresql", file, url))
    done = []
    data_dir.mkdir(parents=True, exist_ok=True, mode=0o700)
    for role, kind, file, where in plans:
        if kind == "sqlite":
            path = Path(where)
            path.parent.mkdir(parents=True, exist_ok=True)
            copy_sqlite(file, path)
            path.chmod(0o600)
            done.append(f"{role} database: {path}")
        else:
            target, env = libpq(where)
            _run(
                [
                    "psql",
                    "-X",
                    "-q",
                    "-v",
                    "ON_ERROR_STOP=1",
                    "--single-transaction",
                    "-d",
                    target,
                    "-f",
                    str(file),
                ],
                env,
                f"loading {file} into {shown_url(where)}",
            )
            done.append(f"{role} database: {shown_url(where)}")
    kept = key or (src / KEY_FILE if manifest["secrets_key"].get("file") else None)
    if kept is not None:
        if not kept.is_file():
            raise BackupError(f"no key file {kept}")
        shutil.copyfile(kept, data_dir / KEY_FILE)
        (data_dir / KEY_FILE).chmod(0o600)
        done.append(f"secrets key: {data_dir / KEY_FILE}")
    else:
        done.append(
            f"secrets key: NOT restored. Put the kept key at {data_dir / KEY_FILE} (mode 0600, "
            "or where secrets_key_file names) BEFORE the hub starts: a hub that finds none there "
            "makes a new key, and the restored secrets stay unreadable"
        )
    return done
