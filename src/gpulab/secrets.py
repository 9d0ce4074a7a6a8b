"""Users' named secrets: encrypted at rest, revealed only into the environment of their jobs.

A secret is a (owner, name) -> value pair kept in the ``user_secrets`` table as a Fernet token
(``cryptography``'s authenticated encryption: AES-128-CBC with an HMAC-SHA256, a random IV per
value). The admin configures the key(s); the first encrypts, all decrypt (MultiFernet), so a
key is rotated by putting a new one first and re-encrypting (:meth:`SecretStore.rotate`).

What leaves this module:
- :meth:`SecretStore.names` and the API built on it give names and times, never values;
- :meth:`SecretStore.reveal` is called by the job supervisor alone, when it creates a job's
  container (the value goes into that container's environment only) or a git clone helper
  (into that helper's secret files only, never its environment).

The database row also binds the owner and name to the token (Fernet's associated data is not
available, so the plaintext is framed as ``owner\\0name\\0value``): a token copied to another
user's row by someone with write access to the database does not decrypt there.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from pathlib import Path

from cryptography.fernet import Fernet, InvalidToken, MultiFernet
from sqlalchemy import delete, select

from .bounds import MAX_ENV_VALUE_BYTES
from .checks import NO_SECRETS_KEY, secret_name
from .db import Database, UserSecret
from .errors import FieldError
from .lifecycle import utcnow

#: a value goes into an environment variable: the same cap as a job's env values
MAX_VALUE_BYTES = MAX_ENV_VALUE_BYTES
#: how many secrets one user may keep
MAX_SECRETS = 100


class SecretError(FieldError):
    """A bad secret name or value (400), or a missing one (the caller decides: 404 or 400)."""


#: why secrets cannot be stored or revealed here (the API answers it 503; a job spec that
#: refers to a secret is refused with the same words: the text is :mod:`gpulab.checks`')
NO_KEY = NO_SECRETS_KEY


class SecretsUnavailable(RuntimeError):
    """No key is configured: secrets cannot be stored or revealed."""


class SecretMissing(LookupError):
    """The owner has no secret of that name (deleted since the job was submitted; at the API
    and the page, 404)."""


def no_secret(name: str) -> SecretMissing:
    """The refusal of a caller's own secret that does not exist, the API's and the page's."""
    return SecretMissing(f"you have no secret {name}")


@dataclass(frozen=True)
class SecretInfo:
    name: str
    created: datetime
    updated: datetime

    def to_json(self) -> dict:
        return {
            "name": self.name,
            "created": self.created.isoformat().replace("+00:00", "Z"),
            "updated": self.updated.isoformat().replace("+00:00", "Z"),
        }


def check_name(name: object, field: str = "name") -> str:
    """A secret's name (:func:`gpulab.checks.secret_name`), refused with a SecretError."""
    return secret_name(SecretError, field, name)


def check_value(value: object) -> str:
    if not isinstance(value, str):
        raise SecretError("value", "value must be a string")
    if value == "":
        raise SecretError("value", "value is empty: a secret needs a value")
    if "\0" in value:
        raise SecretError("value", "value must not contain NUL characters")
    if len(value) > MAX_VALUE_BYTES or len(value.encode()) > MAX_VALUE_BYTES:
        raise SecretError(
            "value", f"value: at most {MAX_VALUE_BYTES} bytes (it becomes an environment variable)"
        )
    return value


def load_keys(keys: list[str], key_file: str) -> list[bytes]:
    """The configured Fernet keys, the encrypting one first: ``keys`` as given, then the
    file's lines (blank lines and ``#`` comments skipped). Raises ValueError for a key that is
    not a Fernet key (32 url-safe base64-encoded bytes), without echoing it."""
    found = [k.strip() for k in keys if k.strip()]
    if key_file and Path(key_file).exists():
        for line in Path(key_file).read_text().splitlines():
            line = line.strip()
            if line and not line.startswith("#"):
                found.append(line)
    out = []
    for i, key in enumerate(found):
        try:
            Fernet(key)
        except (ValueError, TypeError):
            raise ValueError(
                f"secrets key #{i + 1} is not a Fernet key (make one with "
                "`python -c 'from cryptography.fernet import Fernet; "
                "print(Fernet.generate_key().decode())'`)"
            ) from None
        out.append(key.encode())
    return out


class SecretStore:
    """Users' secrets in gpulab's database, per installation (``instance``)."""

    def __init__(self, db: Database, instance: str, keys: list[bytes]):
        self.db = db
        self.instance = instance
        self._fernet = MultiFernet([Fernet(k) for k in keys]) if keys else None

    @property
    def available(self) -> bool:
        return self._fernet is not None

    def _crypt(self) -> MultiFernet:
        if self._fernet is None:
            raise SecretsUnavailable(NO_KEY)
        return self._fernet

    def enabled(self) -> SecretStore:
        """This store, if a key is configured; else SecretsUnavailable (:data:`NO_KEY`)."""
        self._crypt()
        return self

    @staticmethod
    def _frame(owner: str, name: str, value: str) -> bytes:
        return b"\0".join((owner.encode(), name.encode(), value.encode()))

    def put(self, owner: str, name: str, value: str) -> tuple[SecretInfo, bool]:
        """Store (or replace) a secret; (its info, whether it is new)."""
        check_name(name)
        check_value(value)
        token = self._crypt().encrypt(self._frame(owner, name, value)).decode()
        with self.db.session() as s:
            Database.serialize(s, "secrets", self.instance, owner)
            row = s.scalars(
                select(UserSecret).where(
                    UserSecret.instance == self.instance,
                    UserSecret.owner == owner,
                    UserSecret.name == name,
                )
            ).first()
            now = utcnow()
            if row is None:
                count = len(
                    s.scalars(
                        select(UserSecret.id).where(
                            UserSecret.instance == self.instance, UserSecret.owner == owner
                        )
                    ).all()
                )
                if count >= MAX_SECRETS:
                    raise SecretError(
                        "name", f"at most {MAX_SECRETS} secrets per user: delete one first"
                    )
                row = UserSecret(
                    instance=self.instance, owner=owner, name=name, token=token, created=now
                )
                s.add(row)
                new = True
            else:
                row.token = token
                new = False
            row.updated = now
            s.flush()
            return SecretInfo(row.name, row.created, row.updated), new

    def names(self, owner: str) -> list[SecretInfo]:
        with self.db.read() as s:
            rows = s.scalars(
                select(UserSecret)
                .where(UserSecret.instance == self.instance, UserSecret.owner == owner)
                .order_by(UserSecret.name)
            ).all()
            return [SecretInfo(r.name, r.created, r.updated) for r in rows]

    def info(self, owner: str, name: str) -> SecretInfo:
        """The name and times of ``owner``'s secret ``name``; else :func:`no_secret`."""
        found = [i for i in self.names(owner) if i.name == name]
        if not found:
            raise no_secret(name)
        return found[0]

    def remove(self, owner: str, name: str) -> None:
        """Delete ``owner``'s secret ``name``; :func:`no_secret` if there is none."""
        if not self.delete(owner, name):
            raise no_secret(name)

    def delete(self, owner: str, name: str) -> bool:
        with self.db.session() as s:
            result = s.execute(
                delete(UserSecret).where(
                    UserSecret.instance == self.instance,
                    UserSecret.owner == owner,
                    UserSecret.name == name,
                )
            )
            return bool(result.rowcount)

    def reveal(self, owner: str, name: str) -> str:
        """The value, for a job's container only. Raises SecretMissing, or
        SecretsUnavailable when the key that encrypted it is no longer configured."""
        with self.db.read() as s:
            token = s.scalars(
                select(UserSecret.token).where(
                    UserSecret.instance == self.instance,
                    UserSecret.owner == owner,
                    UserSecret.name == name,
                )
            ).first()
        if token is None:
            raise SecretMissing(f"{owner} has no secret {name!r}")
        try:
            framed = self._crypt().decrypt(token.encode())
        except InvalidToken:
            raise SecretsUnavailable(
                f"secret {name!r} cannot be decrypted with the configured keys (was the key "
                "that encrypted it removed?)"
            ) from None
        o, n, value = framed.split(b"\0", 2)
        if o.decode() != owner or n.decode() != name:
            raise SecretsUnavailable(f"secret {name!r} was not stored for this user")
        return value.decode()

    def rotate(self) -> int:
        """Re-encrypt every secret of this installation with the first key; how many."""
        crypt = self._crypt()
        with self.db.session() as s:
            rows = s.scalars(select(UserSecret).where(UserSecret.instance == self.instance)).all()
            for row in rows:
                row.token = crypt.rotate(row.token.encode()).decode()
            return len(rows)


def store_for(settings, db: Database) -> SecretStore:
    """The installation's store, with the keys its settings name."""
    return SecretStore(
        db, settings.instance, load_keys(list(settings.secrets_keys), settings.secrets_key_file)
    )
