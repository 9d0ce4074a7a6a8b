"""Who may log in, and who is an admin, from what the authenticator says (pure).

The hub asks these at its start (``open_login_refusal``: an identity provider's every account
let in) and at each log-in (``groups_of``, ``admin_by_groups``), in ``gpulab.hub_login``.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

#: the authenticator of the trial (jupyterhub_config.py's default): one shared password, on
#: 127.0.0.1; everyone who knows it is meant to get in
SHARED_PASSWORD = "jupyterhub.authenticators.shared.SharedPasswordAuthenticator"


def open_login_refusal(authenticator: str, allow_all: bool, allow_any_identity: bool) -> str | None:
    """Why the hub must not start, or None: an authenticator other than the trial's shared
    password (``authenticator``: its class's full name) with ``allow_all`` lets every account
    of the identity provider in, and a user's name would be all that stands between a
    stranger and the GPUs; only ``c.GpulabSettings.allow_any_identity = True`` says that is
    meant."""
    if authenticator == SHARED_PASSWORD or not allow_all or allow_any_identity:
        return None
    name = authenticator.rpartition(".")[2]
    return (
        f"{name} is configured with c.Authenticator.allow_all = True: every account of the "
        "identity provider could log in. Name who may log in instead: "
        f"c.{name}.allowed_groups (or allowed_users), and drop allow_all; or, if the "
        "identity provider holds nobody but your users, say so with "
        "c.GpulabSettings.allow_any_identity = True"
    )


def _group_name(group: str) -> str:
    """A group as the hub names it: an LDAP group's DN ("cn=ml,ou=groups,dc=example,dc=org")
    by its first RDN's value ("ml"); any other name as it is."""
    first = group.split(",", 1)[0]
    key, eq, value = first.partition("=")
    if eq and "," in group and key.strip().isalpha():
        return value.strip()
    return group


def groups_of(auth_model: Mapping) -> list[str]:
    """The groups the authenticator reported for a log-in, sorted: the model's ``groups``
    (an authenticator with manage_groups, such as OAuthenticator), else LDAPAuthenticator's
    ``ldap_groups`` in its auth state (the DNs of its allowed_groups the user is a member
    of), each by its common name. None reported: no group."""
    groups = auth_model.get("groups")
    if groups is None:
        state = auth_model.get("auth_state") or {}
        groups = state.get("ldap_groups") if isinstance(state, Mapping) else None
    return sorted({_group_name(str(g)) for g in groups or ()})


def admin_by_groups(groups: Iterable[str], admin_groups: Iterable[str]) -> bool:
    """Whether a member of these groups is an admin: one of them is an admin group."""
    return not set(groups).isdisjoint(admin_groups)


def is_shared_password(configured: object) -> bool:
    """Whether ``c.JupyterHub.authenticator_class`` (an entry point's name, a class's full
    name, or a class) is the trial's shared password."""
    if isinstance(configured, type):
        configured = f"{configured.__module__}.{configured.__qualname__}"
    return configured in ("shared-password", SHARED_PASSWORD)
