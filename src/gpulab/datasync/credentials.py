"""Object store credentials: read from the environment or a file, never shown."""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

ACCESS_KEY_ENV = "AWS_ACCESS_KEY_ID"
SECRET_KEY_ENV = "AWS_SECRET_ACCESS_KEY"
SESSION_TOKEN_ENV = "AWS_SESSION_TOKEN"


class CredentialsError(ValueError):
    """Credentials are missing or unreadable (the message never contains a secret)."""


class ProfileMissing(CredentialsError):
    """The credentials file has no such profile."""


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
    def from_file(cls, path: str | Path, profile: str | None = None) -> Credentials:
        """Read an AWS shared-credentials or config file (INI, parsed by botocore as the AWS
        CLI reads it) or ``KEY=VALUE`` lines.

        In an INI file ``profile`` is the section ``[NAME]`` (a credentials file's spelling)
        or ``[profile NAME]`` (a config file's); none named: ``[default]``, else the file's
        only section. ``aws_session_token`` (temporary credentials) is kept."""
        try:
            text = Path(path).read_text()
        except OSError as exc:
            raise CredentialsError(f"cannot read credentials file {path}: {exc.strerror}") from None
        if text.lstrip().startswith("["):
            values = _profile_values(path, profile)
        else:
            if profile:
                raise ProfileMissing(
                    f"credentials file {path} has KEY=VALUE lines, no profiles: "
                    f"profile {profile!r} cannot be read from it"
                )
            values = {}
            for line in text.splitlines():
                line = line.strip()
                if line and not line.startswith("#") and "=" in line:
                    name, _, value = line.partition("=")
                    values[name.strip().lower()] = value.strip().strip("'\"")
        key = values.get("aws_access_key_id")
        secret = values.get("aws_secret_access_key")
        if not (key and secret):
            where = f" (profile {profile!r})" if profile else ""
            raise CredentialsError(
                f"credentials file {path}{where} must define aws_access_key_id and "
                "aws_secret_access_key"
            )
        token = values.get("aws_session_token") or values.get("aws_security_token")
        return cls(key, secret, token or None)

    def to_file_text(self) -> str:
        """These credentials as a credentials file's ``[default]`` profile (what the sync
        helper is handed: a file, never its environment)."""
        lines = [
            "[default]",
            f"aws_access_key_id = {self.access_key_id}",
            f"aws_secret_access_key = {self.secret_access_key}",
        ]
        if self.session_token:
            lines.append(f"aws_session_token = {self.session_token}")
        return "\n".join(lines) + "\n"


def profile_names(sections: Mapping[str, object]) -> dict[str, str]:
    """Profile name -> its section, for the sections of a credentials or config file:
    ``[NAME]`` as in ``~/.aws/credentials``, ``[profile NAME]`` as in ``~/.aws/config`` (the
    former wins when a file has both); other kinds of section (``sso-session``, ``services``)
    are not profiles."""
    names: dict[str, str] = {}
    for section in sections:
        head, _, rest = section.partition(" ")
        if head == "profile" and rest.strip():
            names.setdefault(rest.strip(), section)
    for section in sections:
        if " " not in section.strip():
            names[section.strip()] = section
    return names


def _profile_values(path: str | Path, profile: str | None) -> dict[str, str]:
    from botocore.configloader import raw_config_parse
    from botocore.exceptions import BotoCoreError

    try:
        sections = raw_config_parse(str(path), parse_subsections=False)
    except BotoCoreError:
        raise CredentialsError(f"credentials file {path} is not valid INI") from None
    names = profile_names(sections)
    if profile:
        if profile not in names:
            raise ProfileMissing(
                f"credentials file {path} has no profile {profile!r} "
                f"(it has: {', '.join(sorted(names)) or 'none'})"
            )
        section = names[profile]
    elif "default" in names:
        section = names["default"]
    elif len(names) == 1:
        section = next(iter(names.values()))
    else:
        raise CredentialsError(
            f"credentials file {path} has no [default] profile: name one of "
            f"{', '.join(sorted(names)) or 'none'} with 'profile'"
        )
    return {k.lower(): str(v) for k, v in sections[section].items()}


def ca_bundle_problem(path: str | Path) -> str:
    """Why ``path`` cannot serve as a CA bundle ('' when it can): it must be a readable PEM
    file of certificates that OpenSSL loads."""
    import ssl

    try:
        text = Path(path).read_text()
    except FileNotFoundError:
        return f"{path} does not exist"
    except (OSError, UnicodeDecodeError) as exc:
        return f"{path} cannot be read ({getattr(exc, 'strerror', None) or exc})"
    if "-----BEGIN CERTIFICATE-----" not in text:
        return f"{path} is not a PEM file of certificates (no BEGIN CERTIFICATE)"
    try:
        ssl.create_default_context(cadata=text)
    except (ssl.SSLError, ValueError) as exc:
        return f"{path} is not a valid PEM CA bundle ({exc})"
    return ""
