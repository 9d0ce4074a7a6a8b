"""Object store credentials: read from the environment or a file, never shown."""

from __future__ import annotations

import configparser
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

ACCESS_KEY_ENV = "AWS_ACCESS_KEY_ID"
SECRET_KEY_ENV = "AWS_SECRET_ACCESS_KEY"
SESSION_TOKEN_ENV = "AWS_SESSION_TOKEN"


class CredentialsError(ValueError):
    """Credentials are missing or unreadable (the message never contains a secret)."""


@dataclass(frozen=True)
class Credentials:
    """An access key pair. Neither value appears in ``repr``/``str``."""

    access_key_id: str = field(repr=False)
    secret_access_key: str = field(repr=False)
    session_token: str | None = field(default=None, repr=False)

    @classmethod
    def from_env(
        cls,
        environ: Mapping[str, str] | None = None,
        access_key_env: str = ACCESS_KEY_ENV,
        secret_key_env: str = SECRET_KEY_ENV,
    ) -> Credentials | None:
        """Credentials from two environment variables, or None if both are unset."""
        env = os.environ if environ is None else environ
        key, secret = env.get(access_key_env), env.get(secret_key_env)
        if not key and not secret:
            return None
        if not (key and secret):
            raise CredentialsError(f"set both {access_key_env} and {secret_key_env}, or neither")
        return cls(key, secret, env.get(SESSION_TOKEN_ENV) or None)

    @classmethod
    def from_file(cls, path: str | Path, profile: str = "default") -> Credentials:
        """Read an AWS shared-credentials file (INI) or ``KEY=VALUE`` lines."""
        try:
            text = Path(path).read_text()
        except OSError as exc:
            raise CredentialsError(f"cannot read credentials file {path}: {exc.strerror}") from None
        values: dict[str, str] = {}
        if text.lstrip().startswith("["):
            parser = configparser.ConfigParser()
            try:
                parser.read_string(text)
            except configparser.Error:
                raise CredentialsError(f"credentials file {path} is not valid INI") from None
            section = profile if parser.has_section(profile) else next(iter(parser.sections()), "")
            if section:
                values = {k.lower(): v for k, v in parser.items(section)}
        else:
            for line in text.splitlines():
                line = line.strip()
                if line and not line.startswith("#") and "=" in line:
                    name, _, value = line.partition("=")
                    values[name.strip().lower()] = value.strip().strip("'\"")
        key = values.get("aws_access_key_id")
        secret = values.get("aws_secret_access_key")
        if not (key and secret):
            raise CredentialsError(
                f"credentials file {path} must define aws_access_key_id and aws_secret_access_key"
            )
        return cls(key, secret, values.get("aws_session_token") or None)
