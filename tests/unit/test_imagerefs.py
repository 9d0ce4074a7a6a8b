"""Images from registries, as data: references read as Docker reads them, the admin's
patterns, pull policies, the credentials a secret holds, the job spec's fields and schema,
and a pull's bytes added up (gpulab.imagerefs, gpulab.checks, gpulab.runtime.pulls)."""

from __future__ import annotations

import json

import jsonschema
import pytest

from gpulab import imagerefs
from gpulab.imagerefs import ImageRefError, allowed, check_patterns, parse, registry_auth
from gpulab.jobs.spec import job_spec_schema
from gpulab.resources import Limits
from gpulab.runtime.pulls import LayerBytes

from ..support.jobspecs import CATALOG, FLAVORS, refused
from ..support.jobspecs import parse as parse_spec

D = "sha256:" + "0f" * 32


@pytest.mark.parametrize(
    ("ref", "name", "shown"),
    [
        ("python", "docker.io/library/python", "python:latest"),
        ("python:3.11", "docker.io/library/python", "python:3.11"),
        ("acme/train:2", "docker.io/acme/train", "acme/train:2"),
        ("ghcr.io/acme/trainer:1.2", "ghcr.io/acme/trainer", "ghcr.io/acme/trainer:1.2"),
        ("localhost/a", "localhost/a", "localhost/a:latest"),
        ("127.0.0.1:5443/team/x/y:v1", "127.0.0.1:5443/team/x/y", "127.0.0.1:5443/team/x/y:v1"),
        (f"ghcr.io/acme/t@{D}", "ghcr.io/acme/t", f"ghcr.io/acme/t@{D}"),
        ("index.docker.io/library/busybox", "docker.io/library/busybox", "busybox:latest"),
    ],
)
def test_a_reference_is_read_as_docker_reads_it(ref, name, shown):
    r = parse(ref)
    assert (r.name, str(r)) == (name, shown)
    assert r.pinned(D).endswith("@" + D)


@pytest.mark.parametrize(
    "ref",
    [
        "",
        "Python",
        "a//b",
        "ghcr.io/acme/t:",
        "x:" + "t" * 129,
        "a b",
        "a\nb",
        "é",
        "-a",
        7,
        "ghcr.io/acme/t@sha256:short",
        "a" * 256,
    ],
)
def test_a_bad_reference_is_refused_in_words(ref):
    with pytest.raises(ImageRefError) as e:
        parse(ref)
    assert "reference" in str(e.value)


def test_patterns_match_the_normalised_name_star_within_a_part():
    p = check_patterns(["GHCR.io/acme/*", "127.0.0.1:5443/team/**", "docker.io/library/python"])
    yes = ["ghcr.io/acme/t:1", "127.0.0.1:5443/team/a/b/c", "python:3.11", "docker.io/python"]
    no = [
        "ghcr.io/acme/x/t",
        "ghcr.io/acmex/t",
        "ghcr.io/acme",
        "127.0.0.1:5444/team/a",
        "evil.io/ghcr.io/acme/t",
        "pythonx",
        "acme/python",
    ]
    assert [allowed(parse(r), p) for r in yes] == [True] * len(yes)
    assert [allowed(parse(r), p) for r in no] == [False] * len(no)


@pytest.mark.parametrize(
    "patterns",
    [
        ["*/acme/*"],
        ["ghcr.io"],
        ["acme/*"],
        ["ghcr.io/a b"],
        "ghcr.io/*",
        [3],
        ["g*.io/x"],
        ["ghcr.io/x"] * 201,
    ],
)
def test_a_pattern_must_name_its_registry(patterns):
    with pytest.raises(ImageRefError):
        check_patterns(patterns)


def test_the_credentials_of_a_secret_and_errors_without_it():
    assert registry_auth("bob:p:w", "r.io") == {
        "username": "bob",
        "password": "p:w",
        "serveraddress": "r.io",
    }
    as_json = json.dumps({"username": "bob", "password": "tok"})
    assert registry_auth(as_json, "r.io")["password"] == "tok"
    for bad in ("nocolon-s3cret", ":s3cret", "bob:", '{"username": "bob"}', "{s3cret"):
        with pytest.raises(ImageRefError) as e:
            registry_auth(bad, "r.io")
        assert "s3cret" not in str(e.value)


REG = ("registry.example.org:5000/team/*",)


def test_the_job_spec_takes_an_allowed_registry_image_and_keeps_its_policy():
    spec = parse_spec(
        {
            "command": ["x"],
            "image": "registry.example.org:5000/team/t:1",
            "image_pull_secret": "regcred",
        },
        image_registries=REG,
        secret_names=frozenset({"regcred"}),
    )
    assert (spec.image_pull_policy, spec.image_pull_secret) == ("if-not-present", "regcred")
    assert spec.to_json()["image_pull_policy"] == "if-not-present"
    again = parse_spec(
        {
            "command": ["x"],
            "image": "registry.example.org:5000/team/t:1",
            "image_pull_policy": "always",
        },
        image_registries=REG,
    )
    assert again.image_pull_policy == "always" and again.image_pull_secret is None
    catalog = parse_spec({"command": ["x"], "image": "gpulab/python:3.11"}, image_registries=REG)
    assert catalog.image_pull_policy is None  # the engine's own image: never pulled


@pytest.mark.parametrize(
    ("raw", "field", "words"),
    [
        ({"image": "registry.example.org:5000/other/t"}, "image", "or an image from: "),
        ({"image": "evil.io/team/t"}, "image", "not in the catalog"),
        ({"image": "registry.example.org:5000/team/T"}, "image", "not an image reference"),
        (
            {"image": "gpulab/python:3.11", "image_pull_policy": "always"},
            "image_pull_policy",
            "only for an image from a registry",
        ),
        (
            {"image": "registry.example.org:5000/team/t", "image_pull_policy": "sometimes"},
            "image_pull_policy",
            "always, if-not-present, never",
        ),
        (
            {"image": "registry.example.org:5000/team/t", "image_pull_secret": "other"},
            "image_pull_secret",
            "you have no secret 'other'",
        ),
        (
            {"image": "registry.example.org:5000/team/t", "image_pull_secret": "A B"},
            "image_pull_secret",
            "a secret's name is",
        ),
    ],
)
def test_registry_fields_are_refused_naming_what_to_fix(raw, field, words):
    refused(
        {"command": ["x"], **raw},
        field,
        words,
        image_registries=REG,
        secret_names=frozenset({"regcred"}),
    )


def test_without_patterns_a_registry_image_is_refused():
    refused(
        {"command": ["x"], "image": "registry.example.org:5000/team/t"},
        "image",
        "not in the catalog",
    )


def _schema(**kw):
    return job_spec_schema(
        catalog=CATALOG,
        flavors=FLAVORS,
        limits=Limits(cpus=8, memory=64 << 30, gpus=4),
        allowed_images=(),
        host_gpus=4,
        quota_gpus=None,
        quota_jobs=None,
        max_timeout=86400,
        secret_names=["regcred"],
        **kw,
    )


def test_the_schema_says_what_the_parser_takes():
    on = _schema(image_registries=REG)
    off = _schema()
    body = {
        "command": ["x"],
        "image": "registry.example.org:5000/team/t:1",
        "image_pull_policy": "never",
        "image_pull_secret": "regcred",
    }
    jsonschema.validate(body, on)
    assert "registry.example.org:5000/team/*" in on["properties"]["image"]["description"]
    for schema in (on, off):  # the env's secret references still name the caller's secrets
        env = schema["properties"]["env"]["oneOf"][0]["additionalProperties"]
        assert env["oneOf"][1]["properties"]["secret"] == {"enum": ["regcred"]}
    for schema, bad in (
        (off, body),
        (on, {**body, "image_pull_secret": "other"}),
        (on, {"command": ["x"], "image": "gpulab/python:3.11", "image_pull_policy": "always"}),
        (on, {**body, "image_pull_policy": "sometimes"}),
    ):
        with pytest.raises(jsonschema.ValidationError):
            jsonschema.validate(bad, schema)


def test_a_pull_s_bytes_are_added_up_per_layer():
    added = LayerBytes()
    events = [
        {"status": "Pulling from team/t", "id": "1"},
        {"status": "Pulling fs layer", "id": "a"},
        {"status": "Pulling fs layer", "id": "b"},
        {"status": "Downloading", "id": "a", "progressDetail": {"current": 100, "total": 400}},
        {"status": "Downloading", "id": "b", "progressDetail": {"current": 50, "total": 100}},
        {"status": "Download complete", "id": "a"},
    ]
    got = [added.add(e) for e in events][-1]
    assert (got.done, got.total, got.layers) == (450, 500, 2)
    assert got.line("t:1") == "Pulling image t:1: 0.0 MB of 0.0 MB (2 layers)"
    assert imagerefs.PULL_POLICIES == ("always", "if-not-present", "never")


def test_notebook_options_take_a_registry_image_as_jobs_do():
    from gpulab.notebooks.options import OptionsError, parse_notebook_options
    from gpulab.resources import Limits

    def opts(**raw):
        return parse_notebook_options(
            {"cpus": 1, "memory": "1G", **raw},
            CATALOG,
            FLAVORS,
            Limits(cpus=8, memory=64 << 30, gpus=4),
            None,
            image_registries=REG,
        )

    got = opts(image="registry.example.org:5000/team/lab:2", image_pull_secret="regcred")
    assert (got.image_pull_policy, got.image_pull_secret) == ("if-not-present", "regcred")
    assert got.to_json()["image_pull_secret"] == "regcred"
    assert "image_pull_policy" not in opts().to_json()  # a catalog image: never pulled
    for raw, field in (
        ({"image": "evil.io/team/lab"}, "image"),
        ({"image_pull_policy": "always"}, "image_pull_policy"),
        (
            {"image": "registry.example.org:5000/team/lab", "image_pull_policy": "x"},
            "image_pull_policy",
        ),
        (
            {"image": "registry.example.org:5000/team/lab", "image_pull_secret": "../x"},
            "image_pull_secret",
        ),
        (
            {"image": "registry.example.org:5000/team/lab", "image_pull_secret": "x" * 300},
            "image_pull_secret",
        ),
    ):
        with pytest.raises(OptionsError) as e:
            opts(**raw)
        assert e.value.field == field, (raw, e.value)


def test_a_pull_over_its_cap_is_given_up_and_its_call_closed():
    from gpulab.runtime.base import ImagePullFailed
    from gpulab.runtime.pulls import pull_blocking

    closed = []

    def events():
        try:
            yield {"status": "Pulling fs layer", "id": "a"}
            yield {
                "status": "Downloading",
                "id": "a",
                "progressDetail": {"current": 1, "total": 900},
            }
            yield {
                "status": "Downloading",
                "id": "b",
                "progressDetail": {"current": 1, "total": 900},
            }
            yield {"status": "Download complete", "id": "a"}
        finally:
            closed.append(True)

    class Client:
        hooks: dict = {"response": []}  # a requests session's (the response is kept by one)

        def pull(self, image, **kw):
            assert kw["auth_config"] == {"username": "u"} and kw["stream"] and kw["decode"]
            return events()

    seen = []
    with pytest.raises(ImagePullFailed) as e:
        pull_blocking(Client(), "r.io/a/b@" + D, {"username": "u"}, seen.append, max_bytes=1000)
    assert "cap" in str(e.value) and closed == [True] and seen[-1].total == 1800
    seen.clear()
    pull_blocking(Client(), "r.io/a/b@" + D, {"username": "u"}, seen.append)  # no cap: to its end
    assert (seen[-1].done, seen[-1].total, len(closed)) == (901, 1800, 2)


def test_a_pinned_digest_the_registry_does_not_name_is_refused():
    from gpulab.runtime.base import ImagePullFailed
    from tests.conftest import run_async
    from tests.support.fake_runtime import FakeRuntime

    rt = FakeRuntime(images=set())
    ref = "r.io/team/t:1"
    rt.registry_images[ref] = ("sha256:" + "1" * 64, None)
    rt.registry_digest = lambda image, auth: _answer("sha256:" + "1" * 64)  # the tag's today
    pinned = f"{ref}@sha256:{'2' * 64}"
    rt.add_image(f"r.io/team/t@sha256:{'2' * 64}")  # another user's pull of that digest
    with pytest.raises(ImagePullFailed, match="not the pinned"):
        run_async(rt.fetch_image(pinned, "never", None, lambda p: None))


async def _answer(value):
    return value


def test_a_notebook_volume_at_the_home_s_mount_is_a_400_naming_volumes():
    from gpulab.notebooks.options import OptionsError, parse_notebook_options
    from gpulab.resources import Limits

    from ..support.jobspecs import STORAGE

    def opts(home_dir, mount):
        return parse_notebook_options(
            {"cpus": 1, "memory": "1G", "volumes": [f"team@s3/vision:{mount}:rw"]},
            CATALOG,
            FLAVORS,
            Limits(cpus=8, memory=64 << 30, gpus=4),
            None,
            storage=STORAGE,
            user="ann",
            home_dir=home_dir,
        )

    with pytest.raises(OptionsError) as e:
        opts("/home/jovyan", "/home/jovyan")
    assert e.value.field == "volumes" and "your home's mount" in str(e.value)
    assert opts("/home/jovyan", "/home/jovyan/data").volumes  # under it: fine
    assert opts("", "/home/jovyan").volumes  # homes not kept: the mount is free


def test_a_pull_given_up_by_its_caller_stops_reading():
    import threading

    from gpulab.runtime.base import ImagePullFailed
    from gpulab.runtime.pulls import pull_blocking

    stop = threading.Event()
    read = []

    class Client:
        hooks: dict = {"response": []}

        def pull(self, image, **kw):
            def forever():
                while True:
                    read.append(1)
                    if len(read) == 3:
                        stop.set()  # the caller's wait_for gave up meanwhile
                    yield {
                        "status": "Downloading",
                        "id": "a",
                        "progressDetail": {"current": len(read), "total": 10**9},
                    }

            return forever()

    with pytest.raises(ImagePullFailed, match="given up"):
        pull_blocking(Client(), "r.io/a/b@" + D, None, lambda p: None, 0, stop)
    assert len(read) == 3
