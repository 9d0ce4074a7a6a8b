"""A site file (/etc/gpulab/gpulab_config.py) for log-in through an OpenID Connect provider
(Keycloak, Authentik, Dex, ...) with OAuthenticator's GenericOAuthenticator
(pip install oauthenticator). Register gpulab at the provider as a confidential client with
the redirect URI below, and a "groups" claim in its userinfo; the client's secret comes from
the hub's environment (GPULAB_OAUTH_CLIENT_SECRET), never from this file. Adapt the addresses;
docs/security.md#logging-in says what gpulab makes of it.

Members of the two groups below may log in, nobody else the provider knows; the members of
gpulab-admins are gpulab's admins. tests/integration/test_login.py logs in through this file
against a provider the test runs.
"""

import os

c = get_config()  # noqa: F821 (provided by JupyterHub's config loader)

c.GpulabSettings.public_url = "https://gpulab.example.org/"
c.JupyterHub.authenticator_class = "generic-oauth"
c.GenericOAuthenticator.login_service = "Example SSO"
c.GenericOAuthenticator.oauth_callback_url = "https://gpulab.example.org/hub/oauth_callback"
c.GenericOAuthenticator.client_id = "gpulab"
c.GenericOAuthenticator.client_secret = os.environ.get("GPULAB_OAUTH_CLIENT_SECRET", "")
issuer = "https://sso.example.org/realms/example/protocol/openid-connect"
c.GenericOAuthenticator.authorize_url = f"{issuer}/auth"
c.GenericOAuthenticator.token_url = f"{issuer}/token"
c.GenericOAuthenticator.userdata_url = f"{issuer}/userinfo"
c.GenericOAuthenticator.scope = ["openid", "profile"]
c.GenericOAuthenticator.username_claim = "preferred_username"
# the user's groups: the provider's "groups" claim, kept by the hub at each log-in
c.GenericOAuthenticator.manage_groups = True
c.GenericOAuthenticator.auth_state_groups_key = "oauth_user.groups"
# who may log in: never every account of the provider (the hub refuses allow_all)
c.GenericOAuthenticator.allowed_groups = {"gpulab-users", "gpulab-admins"}
# who administers gpulab: a group, never a user name
c.GpulabSettings.admin_groups = {"gpulab-admins"}
