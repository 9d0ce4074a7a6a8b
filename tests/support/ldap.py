"""A real LDAP directory for the log-in tests: Debian's slapd (scripts/ensure-slapd.sh), started
on a free port of 127.0.0.1 with a throwaway configuration and database, holding a few users
and groups (``PEOPLE``, ``GROUPS``)."""

from __future__ import annotations

import contextlib
import shutil
import signal
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path

from .ports import free_port

#: the shipped LDAP site file (docs/site-examples/ldap.py), which these users and groups fit
EXAMPLE = Path(__file__).resolve().parents[2] / "docs" / "site-examples" / "ldap.py"
SLAPD = Path("/usr/sbin/slapd")
SLAPADD = Path("/usr/sbin/slapadd")
SCHEMA = Path("/etc/ldap/schema")
MODULES = Path("/usr/lib/ldap")

SUFFIX = "dc=example,dc=org"
PEOPLE_DN = f"ou=people,{SUFFIX}"
GROUPS_DN = f"ou=groups,{SUFFIX}"

#: user -> password
PEOPLE = {
    "alice": "alice-pw-1",  # a member of gpulab-users
    "bob": "bob-pw-2",  # in the directory, in no gpulab group
    "admin": "admin-pw-3",  # a directory user called admin, a member of gpulab-users only
    "carol": "carol-pw-4",  # a member of gpulab-admins
}
#: group -> members
GROUPS = {
    "gpulab-users": ["alice", "admin"],
    "gpulab-admins": ["carol"],
    "other": ["bob"],
}


def user_dn(name: str) -> str:
    return f"uid={name},{PEOPLE_DN}"


def group_dn(name: str) -> str:
    return f"cn={name},{GROUPS_DN}"


def missing() -> str | None:
    """What of slapd is missing on this machine, or None."""
    for path in (SLAPD, SLAPADD, SCHEMA / "inetorgperson.schema", MODULES / "back_mdb.la"):
        if not path.exists():
            return f"{path} is missing; run scripts/ensure-slapd.sh"
    return None


def _ldif() -> str:
    entries = [
        f"dn: {SUFFIX}\nobjectClass: dcObject\nobjectClass: organization\ndc: example\no: Example",
        f"dn: {PEOPLE_DN}\nobjectClass: organizationalUnit\nou: people",
        f"dn: {GROUPS_DN}\nobjectClass: organizationalUnit\nou: groups",
    ]
    for name, password in PEOPLE.items():
        entries.append(
            f"dn: {user_dn(name)}\nobjectClass: inetOrgPerson\nuid: {name}\ncn: {name}\n"
            f"sn: {name}\nuserPassword: {password}"
        )
    for name, members in GROUPS.items():
        lines = [f"dn: {group_dn(name)}", "objectClass: groupOfNames", f"cn: {name}"]
        lines += [f"member: {user_dn(m)}" for m in members]
        entries.append("\n".join(lines))
    return "\n\n".join(entries) + "\n"


@dataclass
class Directory:
    """One slapd: ``start()`` writes its configuration and data under ``workdir`` and waits
    until it answers; ``stop()`` ends it."""

    workdir: Path
    port: int = field(default_factory=free_port)
    proc: subprocess.Popen | None = None

    @property
    def url(self) -> str:
        return f"ldap://127.0.0.1:{self.port}/"

    def _config(self) -> Path:
        db = self.workdir / "db"
        db.mkdir(parents=True, exist_ok=True)
        conf = self.workdir / "slapd.conf"
        schemas = ("core", "cosine", "nis", "inetorgperson")
        conf.write_text(
            "".join(f"include {SCHEMA / s}.schema\n" for s in schemas)
            + f"modulepath {MODULES}\nmoduleload back_mdb\n"
            + f"pidfile {self.workdir / 'slapd.pid'}\nargsfile {self.workdir / 'slapd.args'}\n"
            # binds check userPassword; nobody anonymous reads it
            + "access to attrs=userPassword by anonymous auth by self read by * none\n"
            + "access to * by * read\n"
            + f'database mdb\nmaxsize 10485760\nsuffix "{SUFFIX}"\n'
            + f'rootdn "cn=manager,{SUFFIX}"\ndirectory {db}\n'
        )
        return conf

    def start(self, timeout: float = 30) -> Directory:
        conf = self._config()
        data = self.workdir / "data.ldif"
        data.write_text(_ldif())
        subprocess.run(
            [str(SLAPADD), "-f", str(conf), "-l", str(data)],
            check=True,
            capture_output=True,
            timeout=60,
        )
        log = open(self.workdir / "slapd.log", "ab")  # noqa: SIM115 (handed to slapd)
        # -d: in the foreground, logging to stderr (stats: binds and searches)
        self.proc = subprocess.Popen(
            [str(SLAPD), "-f", str(conf), "-h", self.url, "-d", "stats"],
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"slapd exited {self.proc.returncode}:\n{self.log()}")
            if self.answers():
                return self
            time.sleep(0.1)
        raise TimeoutError(f"slapd did not answer on {self.url}:\n{self.log()}")

    def answers(self) -> bool:
        import ldap3

        try:
            conn = ldap3.Connection(
                ldap3.Server("127.0.0.1", port=self.port, connect_timeout=1),
                user=user_dn("alice"),
                password=PEOPLE["alice"],
                auto_bind=True,
                receive_timeout=2,
            )
        except ldap3.core.exceptions.LDAPException:
            return False
        conn.unbind()
        return True

    def log(self) -> str:
        with contextlib.suppress(OSError):
            return (self.workdir / "slapd.log").read_text(errors="replace")[-3000:]
        return ""

    def stop(self) -> None:
        if self.proc and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)
        shutil.rmtree(self.workdir / "db", ignore_errors=True)

    def site_file(self, extra: str = "") -> str:
        """The shipped site file, pointed at this directory (plain LDAP on 127.0.0.1), then
        ``extra``."""
        return (
            f"load_subconfig({str(EXAMPLE)!r})\n"
            'c.LDAPAuthenticator.server_address = "127.0.0.1"\n'
            f"c.LDAPAuthenticator.server_port = {self.port}\n"
            'c.LDAPAuthenticator.tls_strategy = "insecure"\n' + extra
        )
