"""An object store as sites run it: behind TLS with a certificate from a private CA (Debian's
nginx in front of moto, tests/support/tls.py), read with a credentials file's profile that
holds a session token. One hub, three stores on the same endpoint: with the CA bundle, without
it, and with verify=False (a lab)."""

from __future__ import annotations

import json

import boto3
import pytest
from botocore.config import Config

from ..conftest import _need
from ..support.api import Api
from ..support.containers import HelperWatch
from ..support.s3 import TEST_ACCESS_KEY, TEST_SECRET_KEY, FaultyProxy, MotoS3Server
from ..support.tls import TlsProxy, make_ca, nginx_missing

pytestmark = [pytest.mark.docker, pytest.mark.hub]

BUCKET = "tls-data"
SESSION_TOKEN = "FwoGZXIvYXdzEJr//gpulab-session-token+test=="


@pytest.fixture(scope="module")
def site(tmp_path_factory):
    """moto, a recording proxy (the session token each request carries) and nginx with a
    certificate from the test's CA in front of them; a credentials file whose profile has a
    session token."""
    why = nginx_missing()
    if why:
        _need(why)
    work = tmp_path_factory.mktemp("tls-store")
    pki = make_ca(work / "pki")
    s3 = MotoS3Server().start()
    recorder = FaultyProxy(s3.endpoint)
    recorder.__enter__()
    nginx = TlsProxy(work / "nginx", pki, recorder.endpoint).start()
    credentials = work / "aws-credentials"
    credentials.touch(mode=0o600)
    credentials.write_text(
        "[default]\naws_access_key_id = AKIAWRONGPROFILE\naws_secret_access_key = nope\n\n"
        f"[profile ceph]\naws_access_key_id = {TEST_ACCESS_KEY}\n"
        f"aws_secret_access_key = {TEST_SECRET_KEY}\naws_session_token = {SESSION_TOKEN}\n"
    )
    client = boto3.client(
        "s3",
        endpoint_url=nginx.endpoint,
        region_name="us-east-1",
        aws_access_key_id=TEST_ACCESS_KEY,
        aws_secret_access_key=TEST_SECRET_KEY,
        verify=str(pki.ca),
        config=Config(s3={"addressing_style": "path"}),
    )
    client.create_bucket(Bucket=BUCKET)
    client.put_object(Bucket=BUCKET, Key="in/labels.txt", Body=b"cat\ndog\n")
    try:
        yield {
            "pki": pki,
            "nginx": nginx,
            "recorder": recorder,
            "client": client,
            "creds": credentials,
        }
    finally:
        nginx.stop()
        recorder.__exit__()
        s3.stop()


@pytest.fixture(scope="module")
def hub(hub_with, site):
    store = {
        "endpoint_url": site["nginx"].endpoint,
        "credentials": {"file": str(site["creds"]), "profile": "ceph"},
    }
    stores = {
        "tls": {**store, "ca_bundle": str(site["pki"].ca)},
        "tls-untrusted": store,
        "tls-lab": {**store, "verify": False},
    }
    config = "c.GpulabSettings.supervisor_interval = 0.2\n"
    for name, d in stores.items():
        config += f"c.GpulabSettings.object_stores[{name!r}] = {d!r}\n"
        config += (
            f'c.GpulabSettings.volume_grants.append({{"store": {name!r}, "bucket": "{BUCKET}"}})\n'
        )
    return hub_with(config, fresh=True)


def test_a_store_behind_a_private_ca_works_with_its_bundle_and_profile(hub, site, docker_client):
    api = Api(hub, "sam")
    site["recorder"].tokens.clear()
    with HelperWatch(docker_client, hub) as watch:
        job = api.submit(
            command=["sh", "-c", "sort -r /data/labels.txt > /out/sorted.txt"],
            volumes=[f"{BUCKET}@tls/in:/data", f"{BUCKET}@tls/out/run1:/out:rw"],
        )
        done = api.wait(job["id"])
    tokens = list(site["recorder"].tokens)  # the hub's, the service's and the helpers'
    assert done["state"] == "DONE", (done["message"], done["history"])
    assert f"pushed {BUCKET}@tls/out/run1:/out:rw: 1 transferred" in done["message"], done
    body = site["client"].get_object(Bucket=BUCKET, Key="out/run1/sorted.txt")["Body"].read()
    assert body == b"dog\ncat\n"
    # the profile's session token signed the helper's upload (and every request)
    assert ("PUT", SESSION_TOKEN) in tokens, tokens
    assert all(token == SESSION_TOKEN for _, token in tokens), tokens
    # what `docker inspect` shows of a helper: its CA bundle and keys are files in it, named
    # on its command line; no key, secret or token in its environment, command or mounts,
    # and no bind of a host path
    assert watch.seen, "no sync helper was seen running"
    for inspected in watch.seen.values():
        shown = json.dumps(inspected)
        for secret in (TEST_ACCESS_KEY, TEST_SECRET_KEY, SESSION_TOKEN, str(site["creds"])):
            assert secret not in shown
        assert "--ca-bundle" in inspected["Config"]["Cmd"]
        assert not any(b.startswith("/") for b in inspected["HostConfig"]["Binds"] or [])
    # nor the job's container, its record, or the hub's and service's log
    seen = json.dumps(done) + hub.log_file.read_text()
    assert TEST_SECRET_KEY not in seen and SESSION_TOKEN not in seen


def test_without_the_bundle_the_job_fails_naming_the_certificate(hub):
    api = Api(hub, "sam")
    job = api.submit(command=["true"], volumes=[f"{BUCKET}@tls-untrusted/in:/data"])
    done = api.wait(job["id"])
    assert done["state"] == "FAILED", done
    said = done["message"]
    assert f"{BUCKET}@tls-untrusted/in:/data" in said, said
    assert "certificate verify failed: unable to get local issuer certificate" in said, said
    assert "ca_bundle" in said, said


def test_verify_false_works_and_is_warned_of(hub, site):
    api = Api(hub, "sam")
    job = api.submit(
        command=["sh", "-c", "cp /data/labels.txt /out/copy.txt"],
        volumes=[f"{BUCKET}@tls-lab/in:/data", f"{BUCKET}@tls-lab/out/lab:/out:rw"],
    )
    done = api.wait(job["id"])
    assert done["state"] == "DONE", (done["message"], done["history"])
    body = site["client"].get_object(Bucket=BUCKET, Key="out/lab/copy.txt")["Body"].read()
    assert body == b"cat\ndog\n"
    log = hub.log_file.read_text()
    assert "object store 'tls-lab': verify=False, its TLS certificate is not verified" in log
