"""A site file (/etc/gpulab/gpulab_config.py) for log-in against an LDAP directory, with
jupyterhub-ldapauthenticator (pip install jupyterhub-ldapauthenticator). Adapt the addresses
and DNs; docs/security.md#logging-in says what gpulab makes of it.

Members of the two groups below may log in; the members of gpulab-admins are gpulab's admins.
A user's groups (the ones of allowed_groups they are in, by their cn) are kept by the hub at
each log-in, for per-group limits (group_max_resources, group_job_quotas, ...) too.
tests/integration/test_login.py logs in through this file against a real slapd.
"""

c = get_config()  # noqa: F821 (provided by JupyterHub's config loader)

c.JupyterHub.authenticator_class = "ldapauthenticator"
c.LDAPAuthenticator.server_address = "ldap.example.org"
c.LDAPAuthenticator.tls_strategy = "on_connect"  # LDAPS on 636; "before_bind": StartTLS on 389
c.LDAPAuthenticator.bind_dn_template = ["uid={username},ou=people,dc=example,dc=org"]
# who may log in: never every account of the directory (the hub refuses allow_all)
c.LDAPAuthenticator.allowed_groups = [
    "cn=gpulab-users,ou=groups,dc=example,dc=org",
    "cn=gpulab-admins,ou=groups,dc=example,dc=org",
]
# who administers gpulab: a group, never a user name
c.GpulabSettings.admin_groups = {"gpulab-admins"}
