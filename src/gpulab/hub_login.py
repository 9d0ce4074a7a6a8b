"""Log-in in the hub's process: the start-up refusal of an open door, and the groups and admin
flag of each log-in, from the authenticator (the rules are ``gpulab.identity``'s).

jupyterhub_config.py installs both, whatever the authenticator (the trial's shared password
passes the check, and reports no groups): ``refuse_open_login_at_hub_start()`` and
``post_auth_hook`` as ``c.Authenticator.post_auth_hook``.
"""

from __future__ import annotations

import logging

from .hub_process import starting_hub
from .identity import admin_by_groups, groups_of, open_login_refusal
from .settings import GpulabSettings

log = logging.getLogger("gpulab.login")


def post_auth_hook(authenticator, handler, auth_model: dict) -> dict:
    """After a log-in the authenticator allowed: the user's groups are the ones it reported
    (``groups_of``; the hub syncs them when ``manage_groups`` is on, so per-group limits and
    the gpulab-admin role given to ``admin_groups`` follow the directory), and a member of
    one of ``c.GpulabSettings.admin_groups`` is an admin. Nobody is made an admin otherwise:
    the authenticator's own answer (its admin_users, none by default) stands."""
    groups = groups_of(auth_model)
    auth_model["groups"] = groups
    settings = GpulabSettings(config=authenticator.config, check=False)
    if admin_by_groups(groups, settings.admin_groups):
        auth_model["admin"] = True
    return auth_model


def _class_name(cls: type) -> str:
    return f"{cls.__module__}.{cls.__qualname__}"


def refuse_open_login_at_hub_start() -> None:
    """Called from the hub's configuration file: once the hub has made its authenticator
    from its whole configuration (a file that loads this one may still change it), stop the
    hub before it serves anything when ``open_login_refusal`` says so, with the reason at
    CRITICAL in its log. Outside the hub's process (the service reads the same file),
    nothing."""
    starting = starting_hub()
    if starting is None:
        return
    hub, loop = starting

    def check():
        if not hub.trait_has_value("authenticator"):  # made in the hub's init_users
            loop.call_later(0.05, check)
            return
        auth = hub.authenticator
        settings = GpulabSettings(config=hub.config, check=False)
        why = open_login_refusal(
            _class_name(type(auth)), bool(auth.allow_all), settings.allow_any_identity
        )
        if why:
            hub.log.critical("gpulab refuses to start: %s", why)
            raise SystemExit(3)

    loop.call_soon(check)
