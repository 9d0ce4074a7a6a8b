"""Who may log in and who is an admin (gpulab/identity.py), as data."""

import pytest

from gpulab.identity import (
    SHARED_PASSWORD,
    admin_by_groups,
    groups_of,
    is_shared_password,
    open_login_refusal,
)

LDAP = "ldapauthenticator.ldapauthenticator.LDAPAuthenticator"
OAUTH = "oauthenticator.generic.GenericOAuthenticator"


@pytest.mark.parametrize(
    ("authenticator", "allow_all", "allow_any_identity", "refused"),
    [
        (SHARED_PASSWORD, True, False, False),  # the trial: whoever knows the password
        (LDAP, True, False, True),  # every account of the directory
        (OAUTH, True, False, True),
        ("jupyterhub.auth.DummyAuthenticator", True, False, True),
        (LDAP, False, False, False),  # allowed_groups decide
        (LDAP, True, True, False),  # the admin said so
        (OAUTH, False, True, False),
    ],
)
def test_an_open_door_is_refused_unless_said(authenticator, allow_all, allow_any_identity, refused):
    why = open_login_refusal(authenticator, allow_all, allow_any_identity)
    assert (why is not None) == refused
    if refused:
        name = authenticator.rpartition(".")[2]
        assert f"{name} is configured with c.Authenticator.allow_all = True" in why
        assert f"c.{name}.allowed_groups" in why
        assert "c.GpulabSettings.allow_any_identity = True" in why


@pytest.mark.parametrize(
    ("configured", "shared"),
    [
        ("shared-password", True),
        (SHARED_PASSWORD, True),
        ("ldapauthenticator", False),
        ("generic-oauth", False),
        ("dummy", False),
    ],
)
def test_the_trial_is_recognised_by_name(configured, shared):
    assert is_shared_password(configured) == shared


def test_the_trial_is_recognised_by_class():
    from jupyterhub.auth import DummyAuthenticator
    from jupyterhub.authenticators.shared import SharedPasswordAuthenticator

    assert is_shared_password(SharedPasswordAuthenticator)
    assert not is_shared_password(DummyAuthenticator)


@pytest.mark.parametrize(
    ("auth_model", "groups"),
    [
        # an authenticator that manages groups (OAuthenticator): its own list
        ({"name": "a", "groups": ["ml", "gpulab-admins", "ml"]}, ["gpulab-admins", "ml"]),
        ({"name": "a", "groups": []}, []),
        # LDAPAuthenticator: the DNs of its allowed_groups the user is in, by common name
        (
            {
                "name": "a",
                "auth_state": {
                    "ldap_groups": [
                        "cn=gpulab-users,ou=groups,dc=example,dc=org",
                        "cn=gpulab-admins,ou=groups,dc=example,dc=org",
                    ],
                    "user_attributes": {},
                },
            },
            ["gpulab-admins", "gpulab-users"],
        ),
        # nothing reported: no group (never the user's name)
        ({"name": "admin"}, []),
        ({"name": "admin", "auth_state": None}, []),
        ({"name": "admin", "auth_state": {"access_token": "x"}}, []),
    ],
)
def test_groups_are_what_the_authenticator_reported(auth_model, groups):
    assert groups_of(auth_model) == groups


@pytest.mark.parametrize(
    ("groups", "admin_groups", "admin"),
    [
        (["gpulab-admins"], {"gpulab-admins"}, True),
        (["ml", "gpulab-admins"], {"gpulab-admins", "ops"}, True),
        (["ml"], {"gpulab-admins"}, False),
        ([], {"gpulab-admins"}, False),
        (["gpulab-admins"], set(), False),  # no admin group configured: nobody by groups
    ],
)
def test_admins_are_members_of_an_admin_group(groups, admin_groups, admin):
    assert admin_by_groups(groups, admin_groups) == admin
