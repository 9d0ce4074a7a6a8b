"""Real log-in, safe by default, through the shipped site files (docs/site-examples/): a real
LDAP directory (slapd, tests/support/ldap.py) with jupyterhub-ldapauthenticator, and an OpenID
Connect provider the test runs (tests/support/oidc.py) with GenericOAuthenticator. Who logs in
is the groups' answer; admins are the admin group's members, never a user named admin;
per-group limits name the provider's groups; and a hub that would let every account of its
identity provider in refuses to start."""

import pytest

from ..support.api import Api, maxima
from ..support.hub import Hub, login, login_form
from ..support.ldap import PEOPLE
from ..support.oidc import Provider

# one worker: the module's directory, provider and hubs are started once
pytestmark = [pytest.mark.hub, pytest.mark.xdist_group("login")]

#: per-group limits, naming a group of the directory
LIMITS = """
c.GpulabSettings.max_resources = {"cpus": 1, "memory": "4G", "gpus": 0}
c.GpulabSettings.group_max_resources = {"gpulab-users": {"cpus": 3, "memory": "4G", "gpus": 0}}
"""


@pytest.fixture(scope="module")
def hub(hub_with, ldap_directory) -> Hub:
    hub = hub_with("", start=False)
    hub.use_site_file(ldap_directory.site_file(LIMITS))
    return hub.start()


def others_jobs(hub: Hub, name: str) -> int:
    """200 for a gpulab admin (custom:gpulab:admin), 403 for anyone else."""
    return Api(hub, name).call("GET", "/jobs", params={"user": "someone-else"}).status_code


def test_a_member_of_an_allowed_group_logs_in(hub):
    login(hub, "alice", PEOPLE["alice"])
    alice = hub.user_model("alice")
    assert alice["admin"] is False
    assert alice["groups"] == ["gpulab-users"]  # the directory's, by their common name
    assert others_jobs(hub, "alice") == 403


def test_per_group_limits_name_the_directorys_groups(hub):
    login(hub, "alice", PEOPLE["alice"])  # gpulab-users: 3 CPUs
    login(hub, "carol", PEOPLE["carol"])  # gpulab-admins: the default, 1
    for name, cpus in (("alice", {3}), ("carol", {1})):
        doc = Api(hub, name).call("GET", "/openapi.json").json()  # the caller's own limits
        assert maxima(doc, "cpus") == cpus, name


def test_a_wrong_password_is_refused(hub):
    session, r = login_form(hub, "alice", "not-" + PEOPLE["alice"])
    assert r.status_code == 403
    assert "jupyterhub-session-id" not in session.cookies


def test_a_directory_user_in_no_allowed_group_is_refused(hub):
    session, r = login_form(hub, "bob", PEOPLE["bob"])  # the right password
    assert r.status_code == 403
    assert "jupyterhub-session-id" not in session.cookies
    assert hub.user_model("bob") is None  # never became a user


def test_a_directory_user_called_admin_is_not_an_admin(hub):
    login(hub, "admin", PEOPLE["admin"])
    admin = hub.user_model("admin")
    assert admin["admin"] is False
    assert admin["groups"] == ["gpulab-users"]
    assert "gpulab-admin" not in admin["roles"]
    assert others_jobs(hub, "admin") == 403


def test_a_member_of_the_admin_group_is_an_admin(hub):
    login(hub, "carol", PEOPLE["carol"])
    carol = hub.user_model("carol")
    assert carol["admin"] is True  # the hub's admin flag
    assert carol["groups"] == ["gpulab-admins"]
    assert others_jobs(hub, "carol") == 200  # custom:gpulab:admin, through the group


def test_the_trials_passwords_mean_nothing_here(hub):
    """The shared-password trial's settings are its own: no password is generated, and a
    user named admin gets in with the directory's password only."""
    assert not (hub.workdir / "data" / "passwords.txt").exists()
    session, r = login_form(hub, "admin", "anything")
    assert r.status_code == 403


def test_every_account_of_the_directory_is_refused_unless_said(hub_with, ldap_directory):
    """allow_all with a real authenticator: the hub stops before it serves anything and says
    what to configure; with allow_any_identity it starts, and anyone of the directory is in."""
    hub = hub_with("", start=False)
    hub.use_site_file(ldap_directory.site_file("c.LDAPAuthenticator.allow_all = True\n"))
    log = hub.start_refused(60)
    assert hub.proc.returncode == 3
    assert (
        "gpulab refuses to start: LDAPAuthenticator is configured with "
        "c.Authenticator.allow_all = True: every account of the identity provider could "
        "log in. Name who may log in instead: c.LDAPAuthenticator.allowed_groups (or "
        "allowed_users), and drop allow_all; or, if the identity provider holds nobody "
        "but your users, say so with c.GpulabSettings.allow_any_identity = True"
    ) in log
    assert "JupyterHub is now running" not in log
    assert not hub.proxy_pid_file.exists()  # no proxy was started

    hub.use_site_file(
        ldap_directory.site_file(
            "c.LDAPAuthenticator.allow_all = True\nc.GpulabSettings.allow_any_identity = True\n"
        )
    )
    hub.start()
    login(hub, "bob", PEOPLE["bob"])  # in no allowed group, and in: the admin said so
    assert hub.user_model("bob")["admin"] is False


# --- OpenID Connect -------------------------------------------------------------------------


@pytest.fixture(scope="module")
def provider():
    provider = Provider().start()
    yield provider
    provider.stop()


@pytest.fixture(scope="module")
def oidc_hub(hub_with, provider) -> Hub:
    """A hub with the shipped OpenID Connect site file, pointed at the test's provider."""
    hub = hub_with("", start=False)
    hub.use_site_file(provider.site_file(hub))
    hub.env["GPULAB_OAUTH_CLIENT_SECRET"] = provider.client_secret
    return hub.start()


def test_oidc_a_member_logs_in(oidc_hub, provider):
    session, r = provider.login_through(oidc_hub, "alice")
    assert r.status_code == 200, r.text[-500:]
    assert "jupyterhub-session-id" in session.cookies
    alice = oidc_hub.user_model("alice")
    assert alice["admin"] is False
    assert alice["groups"] == ["gpulab-users"]


def test_oidc_a_stranger_account_is_refused(oidc_hub, provider):
    """An account the provider knows, in none of the example's allowed groups."""
    session, r = provider.login_through(oidc_hub, "stranger")
    assert r.status_code == 403
    assert "jupyterhub-session-id" not in session.cookies
    assert oidc_hub.user_model("stranger") is None


def test_oidc_admins_are_the_admin_groups_members(oidc_hub, provider):
    provider.login_through(oidc_hub, "admin")[1].raise_for_status()
    assert oidc_hub.user_model("admin")["admin"] is False
    assert others_jobs(oidc_hub, "admin") == 403
    provider.login_through(oidc_hub, "carol")[1].raise_for_status()
    assert oidc_hub.user_model("carol")["admin"] is True
    assert others_jobs(oidc_hub, "carol") == 200
