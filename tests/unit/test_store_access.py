"""How gpulab reaches an object store as sites run them: credentials files with profiles and
session tokens (parsed by botocore, as the AWS CLI reads them), a per-store CA bundle or
verify=False, the start-up check of both, and how all of it reaches the sync helper: as files,
never in its environment or command line (tests/integration/test_store_tls.py runs it)."""

from __future__ import annotations

import io
import logging
import tarfile

import pytest

from gpulab.data.helper import sync_helper_spec
from gpulab.data.sync import helper_store_files, store_credentials, store_verify
from gpulab.datasync.cli import _parser, _remote
from gpulab.datasync.credentials import (
    Credentials,
    CredentialsError,
    ProfileMissing,
    ca_bundle_problem,
)
from gpulab.datasync.models import tls_refusal
from gpulab.runtime.base import HELPER_FILES_DIR, HelperSpec
from gpulab.runtime.objects import helper_container_config, helper_files_archive
from gpulab.runtime.swarm_specs import helper_service_spec
from gpulab.settings import ConfigError, GpulabSettings
from gpulab.storage import StorageConfig
from gpulab.volumes import VolumeError

from ..support.tls import make_ca

#: a file with every kind of section the AWS CLI knows: a credentials file's [NAME], a config
#: file's [profile NAME], [default], and sections that are not profiles
CREDENTIALS = """\
[default]
aws_access_key_id = AKIADEFAULT
aws_secret_access_key = default-secret

[profile lab]
aws_access_key_id = AKIALAB
aws_secret_access_key = lab-secret
region = eu-west-1

[ceph]
aws_access_key_id = AKIACEPH
aws_secret_access_key = ceph-secret
aws_session_token = ceph-session-token/with+odd=chars

[sso-session corp]
sso_region = us-east-1
"""


@pytest.fixture
def creds_file(tmp_path):
    path = tmp_path / "credentials"
    path.write_text(CREDENTIALS)
    return path


def test_profiles_as_the_aws_cli_reads_them(creds_file):
    assert Credentials.from_file(creds_file) == Credentials("AKIADEFAULT", "default-secret")
    assert Credentials.from_file(creds_file, "lab") == Credentials("AKIALAB", "lab-secret")
    ceph = Credentials.from_file(creds_file, "ceph")
    assert ceph == Credentials("AKIACEPH", "ceph-secret", "ceph-session-token/with+odd=chars")
    assert "ceph-session-token" not in repr(ceph)
    # a profile that is not there names the ones that are, never a secret
    with pytest.raises(ProfileMissing) as exc:
        Credentials.from_file(creds_file, "prod")
    message = str(exc.value)
    assert "no profile 'prod'" in message and "ceph, default, lab" in message
    assert "secret" not in message.replace("aws_secret", "")
    # "sso-session corp" is not a profile
    with pytest.raises(ProfileMissing):
        Credentials.from_file(creds_file, "corp")


def test_a_file_without_default_needs_its_profile_named(tmp_path):
    one = tmp_path / "one"
    one.write_text("[profile only]\naws_access_key_id = A\naws_secret_access_key = B\n")
    assert Credentials.from_file(one) == Credentials("A", "B")  # its only profile
    two = tmp_path / "two"
    two.write_text(one.read_text() + "[other]\naws_access_key_id = C\naws_secret_access_key = D\n")
    with pytest.raises(CredentialsError, match=r"no \[default\] profile: name one of only, other"):
        Credentials.from_file(two)
    # KEY=VALUE lines have no profiles
    env = tmp_path / "env"
    env.write_text("AWS_ACCESS_KEY_ID=A\nAWS_SECRET_ACCESS_KEY=B\nAWS_SESSION_TOKEN=T\n")
    assert Credentials.from_file(env) == Credentials("A", "B", "T")
    with pytest.raises(ProfileMissing):
        Credentials.from_file(env, "lab")


def test_what_the_helper_is_handed_reads_back_as_the_same_credentials(tmp_path):
    for creds in (Credentials("A", "B"), Credentials("A", "B", "tok/en+==")):
        path = tmp_path / "handed"
        path.write_text(creds.to_file_text())
        assert Credentials.from_file(path) == creds


def _store(tmp_path, **more):
    return StorageConfig.from_config({"ceph": {"endpoint_url": "https://ceph:7480", **more}}, [])


def test_a_store_sends_its_profile_token_and_ca_bundle_to_the_helper_as_files(tmp_path, creds_file):
    pki = make_ca(tmp_path / "pki")
    store = _store(
        tmp_path,
        credentials={"file": str(creds_file), "profile": "ceph"},
        ca_bundle=str(pki.ca),
    ).stores["ceph"]
    assert store_verify(store) == str(pki.ca)
    assert store_credentials(store)["AWS_SESSION_TOKEN"] == "ceph-session-token/with+odd=chars"
    files, args = helper_store_files(store)
    assert set(files) == {"store-credentials", "store-ca.pem"}
    assert files["store-ca.pem"] == pki.ca.read_bytes()
    handed = tmp_path / "handed"
    handed.write_bytes(files["store-credentials"])
    assert Credentials.from_file(handed) == Credentials(
        "AKIACEPH", "ceph-secret", "ceph-session-token/with+odd=chars"
    )
    assert args == [
        "--credentials-file",
        f"{HELPER_FILES_DIR}/store-credentials",
        "--ca-bundle",
        f"{HELPER_FILES_DIR}/store-ca.pem",
    ]
    spec = sync_helper_spec(
        image="gpulab/sync:1",
        operation="pull",
        bucket="b",
        prefix="p",
        mode="ro",
        docker_volume="vol",
        store_kind="s3",
        store_root=None,
        endpoint_url=store.endpoint_url,
        region=store.region,
        labels={},
        environment={},
        files=files,
        store_args=args,
    )
    config = helper_container_config(spec)
    # what an inspection of the helper shows: no key, no secret, no token, no host path
    shown = repr(config)
    for secret in ("AKIACEPH", "ceph-secret", "ceph-session-token", str(tmp_path)):
        assert secret not in shown
    assert config["command"][-len(args) :] == args
    # the one engine copies them in: a directory and files only the helper's user reads
    with tarfile.open(fileobj=io.BytesIO(helper_files_archive(spec))) as tar:
        members = {m.name: m for m in tar.getmembers()}
        assert set(members) == {
            "run/secrets",
            "run/secrets/store-ca.pem",
            "run/secrets/store-credentials",
        }
        assert members["run/secrets"].mode == 0o700 and members["run/secrets"].isdir()
        for name in ("store-ca.pem", "store-credentials"):
            m = members[f"run/secrets/{name}"]
            assert (m.mode, m.uid, m.gid) == (0o400, 1000, 100)
            assert tar.extractfile(m).read() == files[name]
    # a Swarm hands them as its secrets, mounted at the same place
    body = helper_service_spec(config, "worker-1", [("id1", "h-store-ca.pem", "store-ca.pem")])
    container = body["TaskTemplate"]["ContainerSpec"]
    assert container["Secrets"] == [
        {
            "SecretID": "id1",
            "SecretName": "h-store-ca.pem",
            "File": {"Name": "store-ca.pem", "UID": "1000", "GID": "100", "Mode": 0o400},
        }
    ]
    assert "ceph-secret" not in repr(body)
    with pytest.raises(ValueError, match="plain name"):
        helper_files_archive(HelperSpec(image="i", command=[], files={"../x": b""}))


def test_verify_false_is_an_argument_and_a_lab_setting(tmp_path, creds_file):
    store = _store(tmp_path, credentials={"file": str(creds_file)}, verify=False).stores["ceph"]
    assert store_verify(store) is False
    files, args = helper_store_files(store)
    assert set(files) == {"store-credentials"} and args[-1] == "--no-verify-tls"
    # the helper's own reading of those arguments
    parsed = _parser().parse_args(
        ["pull", "--bucket", "b", "--local", "/d", "--store-endpoint", "https://ceph:7480"]
        + ["--credentials-file", str(creds_file), "--profile", "ceph", "--no-verify-tls"]
    )
    remote = _remote(parsed)
    assert remote.verify is False and remote._credentials.session_token.startswith("ceph-")


def test_bad_store_settings_are_refused_naming_the_store_and_field(tmp_path, creds_file):
    with pytest.raises(VolumeError, match="'ceph': ca_bundle must be an absolute path"):
        _store(tmp_path, ca_bundle="ca.pem")
    with pytest.raises(VolumeError, match="'ceph': ca_bundle and verify=False contradict"):
        _store(tmp_path, ca_bundle="/ca.pem", verify=False)
    with pytest.raises(VolumeError, match="'ceph': verify must be True or False"):
        _store(tmp_path, verify="no")
    with pytest.raises(VolumeError, match="'ceph': credentials.profile names a profile of a"):
        _store(tmp_path, credentials={"profile": "x"})

    def settings(**store):
        stores = {"ceph": {"endpoint_url": "https://ceph:7480", **store}}
        return GpulabSettings(object_stores=stores)

    with pytest.raises(ConfigError, match=r"object_stores: object store 'ceph': ca_bundle .*"):
        settings(ca_bundle=str(tmp_path / "missing.pem"))
    not_pem = tmp_path / "not.pem"
    not_pem.write_text("hello\n")
    with pytest.raises(ConfigError, match="'ceph': ca_bundle .*not a PEM file"):
        settings(ca_bundle=str(not_pem))
    broken = tmp_path / "broken.pem"
    broken.write_text("-----BEGIN CERTIFICATE-----\nAAAA\n-----END CERTIFICATE-----\n")
    with pytest.raises(ConfigError, match="'ceph': ca_bundle .*not a valid PEM CA bundle"):
        settings(ca_bundle=str(broken))
    with pytest.raises(ConfigError, match="'ceph': credentials.profile: .*no profile 'prod'"):
        settings(credentials={"file": str(creds_file), "profile": "prod"})
    assert settings(credentials={"file": str(creds_file), "profile": "lab"})


def test_verify_false_is_logged_once_at_warning(tmp_path, caplog, creds_file):
    stores = {"lab-minio": {"endpoint_url": "https://minio:9000", "verify": False}}
    with caplog.at_level(logging.WARNING, logger="gpulab.settings"):
        GpulabSettings(object_stores=stores)
        GpulabSettings(object_stores=stores)
    warned = [r for r in caplog.records if "lab-minio" in r.getMessage()]
    assert len(warned) == 1 and warned[0].levelno == logging.WARNING
    assert "verify=False" in warned[0].getMessage() and "not verified" in warned[0].getMessage()


def test_a_ca_bundle_is_checked_as_openssl_loads_it(tmp_path):
    pki = make_ca(tmp_path)
    assert ca_bundle_problem(pki.ca) == ""
    assert "not a PEM file" in ca_bundle_problem(pki.key)
    assert "does not exist" in ca_bundle_problem(tmp_path / "none")


def test_a_refused_certificate_is_named():
    text = (
        "SSL validation failed for https://127.0.0.1:1/b?list-type=2 [SSL: "
        "CERTIFICATE_VERIFY_FAILED] certificate verify failed: unable to get local issuer "
        "certificate (_ssl.c:1006)"
    )
    said = tls_refusal(text)
    assert "certificate verify failed: unable to get local issuer certificate" in said
    assert "ca_bundle" in said
    assert tls_refusal("Connection refused") == ""
