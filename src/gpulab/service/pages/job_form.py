"""The job submit form <-> a job body: the form's strings as the JSON body that
:func:`gpulab.jobs.actions.submit` takes (with errors by form field), and a refusal's spec
field as the form field it is shown next to. Pure: no handler, no request."""

from __future__ import annotations

import json
from typing import Any

from ...jobs.spec import MAX_WORKERS
from ...notices import EVENTS

# form field -> the spec fields whose errors are shown next to it
_FIELD_OF = {
    "framework": "environment",
    "version": "environment",
    "image": "environment",
    "resources.cpus": "cpus",
    "resources.memory": "memory",
    "resources.gpus": "gpus",
    "resources": "flavor",
    "args": "command",
    "hang_restart": "timeout",
    "env": "env",
    "ports": "ports",
    "git": "git",
    "working_dir": "working_dir",
    "read_only_rootfs": "read_only",
    "notify": "notify_webhook",
    "notify.webhook": "notify_webhook",
    "notify.email": "notify_email",
    "notify.on": "notify_on",
}


def form_field(spec_field: str | None) -> str:
    if not spec_field:
        return "form"
    if spec_field in _FIELD_OF:
        return _FIELD_OF[spec_field]
    head = spec_field.split(".", 1)[0].split("[", 1)[0]
    return _FIELD_OF.get(head, head)


def form_to_job(form: dict[str, str]) -> tuple[dict, dict[str, str]]:
    """The submit form's strings as a job body (JSON types), or errors by form field."""
    raw: dict[str, Any] = {}
    errors: dict[str, str] = {}
    if form.get("name"):
        raw["name"] = form["name"]
    env_choice = form.get("environment", "")
    if env_choice:
        fw, _, version = env_choice.partition("/")
        raw["framework"] = fw
        if version:
            raw["version"] = version
    command = form.get("command", "").strip()
    if not command:
        errors["command"] = "give the command to run, e.g. python train.py"
    else:
        raw["command"] = command
    if form.get("flavor"):
        raw["flavor"] = form["flavor"]
    resources: dict[str, Any] = {}
    for key, conv in (("cpus", float), ("gpus", int)):
        value = form.get(key, "").strip()
        if value:
            try:
                resources[key] = conv(value)
            except ValueError:
                kind = "a whole number" if conv is int else "a number"
                errors[key] = f"{key} must be {kind}, not {value!r}"
    if form.get("memory", "").strip():
        resources["memory"] = form["memory"].strip()
    if resources:
        raw["resources"] = resources
    for key in ("gpu_model", "node_pool"):  # a choice of the form's lists; "" for any
        if form.get(key, "").strip():
            raw[key] = form[key].strip()
    workers = form.get("workers", "").strip()
    if workers:
        try:
            raw["workers"] = int(workers)
        except ValueError:
            errors["workers"] = (
                f"workers must be a whole number from 1 to {MAX_WORKERS}, not {workers!r}"
            )
    _sweep(form, raw, errors)
    env: dict[str, str] = {}
    for n, line in enumerate(form.get("env", "").splitlines(), 1):
        if not line.strip():
            continue
        if "=" not in line:
            errors["env"] = f"line {n}: write NAME=value, not {line.strip()!r}"
            break
        k, v = line.split("=", 1)
        env[k.strip()] = v
    if env:
        raw["env"] = env
    volumes = [v.strip() for v in form.get("volumes", "").splitlines() if v.strip()]
    if volumes:
        raw["volumes"] = volumes
    if form.get("timeout", "").strip():
        raw["timeout"] = form["timeout"].strip()
    retries = form.get("retries", "").strip()
    if retries:
        try:
            raw["retries"] = int(retries)
        except ValueError:
            errors["retries"] = f"retries must be a whole number, not {retries!r}"
    raw["preemptible"] = form.get("preemptible") in ("on", "true", "1")
    if form.get("terminate_after_preemption") in ("on", "true", "1"):
        raw["terminate_after_preemption"] = True
    if form.get("auto_delete_after", "").strip():
        raw["auto_delete_after"] = form["auto_delete_after"].strip()
    _reaching_in(form, raw, errors)
    _notify(form, raw)
    return raw, errors


def _notify(form: dict[str, str], raw: dict[str, Any]) -> None:
    """The notice fields (a webhook, an e-mail address, the events ticked: none ticked
    means all) into the job body ``raw``; none given, no ``notify``."""
    notify: dict[str, Any] = {
        key: form[f"notify_{key}"].strip()
        for key in ("webhook", "email")
        if form.get(f"notify_{key}", "").strip()
    }
    on = [e for e in EVENTS if form.get(f"notify_{e}") in ("on", "true", "1")]
    if on:  # events without a webhook or an address: the API's refusal says what is missing
        notify["on"] = on
    if notify:
        raw["notify"] = notify


def _sweep(form: dict[str, str], raw: dict[str, Any], errors: dict[str, str]) -> None:
    """A job array's fields: tasks, at most at once, and parameter sets (a JSON list)."""
    for key in ("completions", "parallelism"):
        value = form.get(key, "").strip()
        if value:
            try:
                raw[key] = int(value)
            except ValueError:
                errors[key] = f"{key} must be a whole number, not {value!r}"
    text = form.get("parameters", "").strip()
    if text:
        try:
            raw["parameters"] = json.loads(text)
        except ValueError as e:
            errors["parameters"] = (
                f'write a JSON list of objects, such as [{{"lr": 0.1}}, {{"lr": 0.01}}] ({e})'
            )


#: the submit form's fields
FORM_FIELDS = (
    "name",
    "environment",
    "command",
    "flavor",
    "cpus",
    "memory",
    "gpus",
    "gpu_model",
    "node_pool",
    "workers",
    "completions",
    "parallelism",
    "parameters",
    "env",
    "volumes",
    "timeout",
    "retries",
    "preemptible",
    "terminate_after_preemption",
    "auto_delete_after",
    "secret_env",
    "ports",
    "share",
    "git",
    "working_dir",
    "read_only",
    "notify_webhook",
    "notify_email",
    *(f"notify_{e}" for e in EVENTS),
)


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


def _reaching_in(form: dict[str, str], raw: dict[str, Any], errors: dict[str, str]) -> None:
    """The fields of what reaches into a job (secrets, ports and who they are shared with,
    git repositories, working dir, read-only root) into the job body ``raw`` (or ``errors``
    by form field)."""
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
