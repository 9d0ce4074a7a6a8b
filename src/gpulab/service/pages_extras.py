"""The pages' share of what reaches into a job (ports, secrets, git, working dir, read-only
root): the submit form's extra fields (the secrets page is in secrets_api.py)."""

from __future__ import annotations

from typing import Any

#: the submit form's fields beyond the original ones (pages._FORM_FIELDS adds them)
EXTRA_FORM_FIELDS = ("secret_env", "ports", "share", "git", "working_dir", "read_only")
_GIT_KEYS = ("branch", "revision", "path", "secret")


def _pairs(text: str, field: str, left: str, errors: dict[str, str]) -> list[tuple[str, str]]:
    out = []
    for n, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        name, sep, value = line.strip().partition("=")
        if not sep or not name.strip():
            errors[field] = f"line {n}: write {left}=..., not {line.strip()!r}"
            return []
        out.append((name.strip(), value.strip()))
    return out


def form_extras(form: dict[str, str], raw: dict[str, Any], errors: dict[str, str]) -> None:
    """The extra fields' strings into the job body ``raw`` (or ``errors`` by form field)."""
    secret_env = _pairs(form.get("secret_env", ""), "secret_env", "VAR", errors)
    if secret_env:
        env = raw.setdefault("env", {})
        for var, secret in secret_env:
            if var in env:
                errors["secret_env"] = f"{var} is also a plain environment variable"
                break
            env[var] = {"secret": secret}
    share = [u.strip() for u in form.get("share", "").split(",") if u.strip()]
    ports = []
    for name, number in _pairs(form.get("ports", ""), "ports", "NAME", errors):
        if not number.isdigit():
            errors["ports"] = f"{name}: the port must be a number, not {number!r}"
            break
        ports.append({"port": int(number), "name": name, **({"users": share} if share else {})})
    if ports:
        raw["ports"] = ports
    elif share:
        errors["share"] = "give the ports to share first"
    repos = []
    for n, line in enumerate(form.get("git", "").splitlines(), 1):
        parts = line.split()
        if not parts:
            continue
        repo = {"url": parts[0]}
        for part in parts[1:]:
            key, sep, value = part.partition("=")
            if not sep or key not in _GIT_KEYS:
                errors["git"] = (
                    f"line {n}: after the URL write any of {', '.join(k + '=' for k in _GIT_KEYS)}"
                )
                break
            repo[key] = value
        repos.append(repo)
    if repos:
        raw["git"] = repos
    if form.get("working_dir", "").strip():
        raw["working_dir"] = form["working_dir"].strip()
    if form.get("read_only") in ("on", "true", "1"):
        raw["read_only_rootfs"] = True
