"""Ports, secret references, working_dir and read_only_rootfs of a job (pure), and the secret
store on a real SQLite file (encryption at rest, rotation, no value anywhere in clear)."""

from __future__ import annotations

import sqlite3

import pytest
from cryptography.fernet import Fernet

from gpulab.db import Database, UserSecret
from gpulab.jobs.spec import JobSpec, Port
from gpulab.jobs.spec.ports import port_env
from gpulab.runtime.base import WorkloadSpec
from gpulab.runtime.objects import workload_container_config
from gpulab.runtime.swarm_specs import service_spec
from gpulab.secrets import (
    MAX_SECRETS,
    NO_KEY,
    SecretError,
    SecretMissing,
    SecretStore,
    SecretsUnavailable,
    load_keys,
)
from gpulab.service.base import ADMIN, BaseHandler

from ..support.jobspecs import parse, refused

CMD = {"command": ["python", "train.py"]}


# --- ports ---------------------------------------------------------------------------------


def test_ports_parse_round_trip_and_tell_the_job_its_path():
    spec = parse(
        CMD
        | {
            "ports": [
                {"port": 6006, "name": "tensorboard", "users": ["bob", "bob"], "groups": ["ml"]},
                {"port": 8080.0, "name": "demo-app"},
            ]
        }
    )
    assert spec.ports == (
        Port(6006, "tensorboard", ("bob",), ("ml",)),
        Port(8080, "demo-app"),
    )
    assert JobSpec.from_json(spec.to_json()) == spec
    assert port_env(spec.ports, "/services/gpulab/jobs/abc") == {
        "GPULAB_PORT_TENSORBOARD": "6006",
        "GPULAB_PORT_TENSORBOARD_PATH": "/services/gpulab/jobs/abc/ports/tensorboard",
        "GPULAB_PORT_DEMO_APP": "8080",
        "GPULAB_PORT_DEMO_APP_PATH": "/services/gpulab/jobs/abc/ports/demo-app",
    }
    port = spec.ports[0]
    assert port.may_open("bob", []) and port.may_open("eve", ["ml"])
    assert not port.may_open("eve", ["other"])


@pytest.mark.parametrize(
    "ports, field, words",
    [
        ({"port": 1}, "ports", "must be a list"),
        ([{"port": 80, "name": "web"}], "ports[0].port", "1024 to 65535"),
        ([{"port": True, "name": "web"}], "ports[0].port", "whole number"),
        ([{"port": 8080, "name": "Web"}], "ports[0].name", "lowercase"),
        ([{"port": 8080, "name": "a" * 33}], "ports[0].name", "1 to 32"),
        ([{"port": 8080}], "ports[0].name", "lowercase"),
        (
            [{"port": 8080, "name": "a"}, {"port": 8081, "name": "a"}],
            "ports[1].name",
            "given twice",
        ),
        (
            [{"port": 8080, "name": "a"}, {"port": 8080, "name": "b"}],
            "ports[1].port",
            "given twice",
        ),
        ([{"port": 8080, "name": "a", "host": "0.0.0.0"}], "ports[0].host", "unknown field"),
        ([{"port": 8080 + i, "name": f"p{i}"} for i in range(9)], "ports", "at most 8"),
        ([{"port": 8080, "name": "a", "users": ["x"] * 33}], "ports[0].users", "at most 32"),
        ([{"port": 8080, "name": "a", "groups": [""]}], "ports[0].groups", "1 to 255"),
    ],
)
def test_port_refusals(ports, field, words):
    refused(CMD | {"ports": ports}, field, words)


# --- secrets in the environment ------------------------------------------------------------


def test_secret_references_are_kept_apart_and_shown_as_references():
    raw = CMD | {"env": {"PLAIN": "1", "WANDB_API_KEY": {"secret": "wandb"}}}
    spec = parse(raw, secret_names=frozenset({"wandb"}))
    assert spec.env == {"PLAIN": "1"}
    assert spec.secret_env == {"WANDB_API_KEY": "wandb"}
    assert spec.to_json()["env"] == {"PLAIN": "1", "WANDB_API_KEY": {"secret": "wandb"}}
    assert JobSpec.from_json(spec.to_json()) == spec
    # the list form (Kubernetes' and Run:ai's shape) means the same
    listed = CMD | {
        "env": [{"name": "PLAIN", "value": "1"}, {"name": "WANDB_API_KEY", "secret": "wandb"}]
    }
    assert parse(listed, secret_names=frozenset({"wandb"})) == spec


@pytest.mark.parametrize(
    "env, names, field, words",
    [
        ({"K": {"secret": "nope"}}, frozenset({"wandb"}), "env.K", "gpulab secret set nope"),
        ({"K": {"secret": "wandb"}}, None, "env.K", "not enabled"),
        ({"K": {"secret": "Bad Name"}}, frozenset(), "env.K", "lowercase"),
        ({"K": {"secret": "w", "value": "x"}}, frozenset({"w"}), "env.K", "unknown field"),
        ({"K": {"value": "x"}}, frozenset(), "env.K", "unknown field"),
        ([{"name": "K"}], frozenset(), "env[0]", "one of value or secret"),
        ([{"name": "K", "value": "1", "secret": "w"}], frozenset(), "env[0]", "one of"),
        ([{"name": "K", "value": "1"}, {"name": "K", "value": "2"}], None, "env[1]", "twice"),
        ([7], None, "env[0]", '{"name": NAME'),
        (
            {"AWS_SECRET_ACCESS_KEY": {"secret": "w"}},
            frozenset({"w"}),
            "env.AWS_SECRET_ACCESS_KEY",
            "reserved",
        ),
    ],
)
def test_secret_reference_refusals(env, names, field, words):
    refused(CMD | {"env": env}, field, words, secret_names=names)


def test_with_secrets_off_a_reference_is_refused_with_the_secrets_apis_words():
    """One refusal for "no key configured": the secrets API's 503 and a job spec's 400 (an
    env entry or a git entry that names a secret) say the same."""
    assert refused(CMD | {"env": {"K": {"secret": "wandb"}}}, "env.K", secret_names=None) == NO_KEY
    git = [{"url": "https://git.example.com/a/b.git", "secret": "gitlab"}]
    assert refused(CMD | {"git": git}, "git[0].secret", secret_names=None) == NO_KEY


# --- working_dir and read_only_rootfs --------------------------------------------------------


def test_working_dir_and_read_only_reach_both_engines():
    spec = parse(CMD | {"working_dir": "/workspace/src", "read_only_rootfs": True})
    assert spec.working_dir == "/workspace/src" and spec.read_only_rootfs
    assert JobSpec.from_json(spec.to_json()) == spec
    assert JobSpec.from_json({"image": "x", "command": ["y"]}).working_dir is None

    w = WorkloadSpec(
        name="j", image="img", command=["x"], working_dir="/workspace/src", read_only=True,
        tmp_size=64 * 1024**2,
    )  # fmt: skip
    docker = workload_container_config(w, "env", "/runner.sh")
    assert docker["working_dir"] == "/workspace/src"
    assert docker["host_config"]["read_only"] is True
    assert docker["host_config"]["tmpfs"] == {
        "/tmp": f"rw,nosuid,nodev,size={64 * 1024**2},mode=1777"
    }
    swarm = service_spec(w, {"ConfigID": "c", "ConfigName": "r"}, "net")
    container = swarm["TaskTemplate"]["ContainerSpec"]
    assert container["Dir"] == "/workspace/src" and container["ReadOnly"] is True
    tmp = [m for m in container["Mounts"] if m["Target"] == "/tmp"]
    assert tmp == [
        {"Type": "tmpfs", "Target": "/tmp", "TmpfsOptions": {"SizeBytes": 64 * 1024**2, "Mode": 0o1777}}
    ]  # fmt: skip
    plain = workload_container_config(WorkloadSpec(name="j", image="i", command=["x"]), "env", "/r")
    assert "working_dir" not in plain and "read_only" not in plain["host_config"]


@pytest.mark.parametrize(
    "value, words",
    [
        ("workspace", "absolute"),
        ("/workspace/../etc", "normalized"),
        ("/workspace/", "normalized"),
        ("/etc/x", "system directory"),
        ("/opt/gpulab", "system directory"),
        ("/", "system directory"),
        (7, "absolute path"),
        ("/w" * 600, "absolute path"),
    ],
)
def test_working_dir_refusals(value, words):
    refused(CMD | {"working_dir": value}, "working_dir", words)


def test_read_only_refusal():
    refused(CMD | {"read_only_rootfs": "yes"}, "read_only_rootfs", "true or false")


# --- the secret store ------------------------------------------------------------------------


@pytest.fixture
def store(tmp_path):
    db = Database(f"sqlite:///{tmp_path / 'g.sqlite'}")
    return SecretStore(db, "t", [Fernet.generate_key()])


def test_a_secret_is_stored_encrypted_and_revealed_only_to_its_owner(store, tmp_path):
    value = "wandb-" + "k" * 40
    info, new = store.put("ann", "wandb", value)
    assert new and info.name == "wandb"
    assert store.put("ann", "wandb", value + "2")[1] is False  # replaced
    assert [i.name for i in store.names("ann")] == ["wandb"]
    assert store.names("bob") == []
    assert store.reveal("ann", "wandb") == value + "2"
    with pytest.raises(SecretMissing):
        store.reveal("bob", "wandb")
    # nowhere in clear in the database file (nor the WAL beside it)
    for f in tmp_path.iterdir():
        assert value.encode() not in f.read_bytes(), f
    # a token copied into another user's row does not reveal there
    with store.db.session() as s:
        token = s.query(UserSecret).filter_by(owner="ann").one().token
        s.add(UserSecret(instance="t", owner="bob", name="wandb", token=token))
    with pytest.raises(SecretsUnavailable, match="not stored for this user"):
        store.reveal("bob", "wandb")
    assert store.delete("ann", "wandb") and not store.delete("ann", "wandb")


def test_rotation_and_a_lost_key(store):
    old_key, new_key = Fernet.generate_key(), Fernet.generate_key()
    SecretStore(store.db, "t", [old_key]).put("ann", "a", "one")
    assert SecretStore(store.db, "t", [new_key, old_key]).rotate() == 1
    assert SecretStore(store.db, "t", [new_key]).reveal("ann", "a") == "one"
    with pytest.raises(SecretsUnavailable, match="cannot be decrypted"):
        SecretStore(store.db, "t", [old_key]).reveal("ann", "a")
    with pytest.raises(SecretsUnavailable, match="not enabled"):
        SecretStore(store.db, "t", []).put("ann", "b", "x")


def test_secret_refusals(store):
    for name in ("", "A", "-x", "a" * 64, "a/b", 3):
        with pytest.raises(SecretError, match="name"):
            store.put("ann", name, "v")
    for value, words in (("", "empty"), ("a\0b", "NUL"), ("x" * 40000, "at most"), (3, "string")):
        with pytest.raises(SecretError, match=words):
            store.put("ann", "ok", value)
    for i in range(MAX_SECRETS):
        store.put("ann", f"s{i}", "v")
    with pytest.raises(SecretError, match=f"at most {MAX_SECRETS}"):
        store.put("ann", "one-more", "v")


@pytest.mark.parametrize(
    ("call", "refusal", "message"),
    [
        (lambda st: st.info("ann", "absent"), SecretMissing, "you have no secret absent"),
        (lambda st: st.info("bob", "wandb"), SecretMissing, "you have no secret wandb"),
        (lambda st: st.remove("ann", "absent"), SecretMissing, "you have no secret absent"),
        (lambda st: st.remove("bob", "wandb"), SecretMissing, "you have no secret wandb"),
        (
            lambda st: SecretStore(st.db, "t", []).enabled(),
            SecretsUnavailable,
            "secrets are not enabled: the admin has configured no key "
            "(c.GpulabSettings.secrets_keys or secrets_key_file)",
        ),
        (lambda st: SecretStore(st.db, "t", []).put("ann", "b", "x"), SecretsUnavailable, NO_KEY),
    ],
)
def test_the_stores_refusals_are_the_doors_messages(store, call, refusal, message):
    """The API and the page answer these messages as they are (404, 503): built here once."""
    store.put("ann", "wandb", "v")
    with pytest.raises(refusal) as e:
        call(store)
    assert str(e.value) == message
    assert store.info("ann", "wandb").name == "wandb" and store.enabled() is store
    store.remove("ann", "wandb")
    assert store.names("ann") == []


def test_key_loading(tmp_path):
    k1, k2 = Fernet.generate_key().decode(), Fernet.generate_key().decode()
    f = tmp_path / "keys"
    f.write_text(f"# rotated 2026-11\n{k2}\n\n")
    assert load_keys([k1], str(f)) == [k1.encode(), k2.encode()]
    assert load_keys([], str(tmp_path / "absent")) == []
    with pytest.raises(ValueError, match="#1 is not a Fernet key") as e:
        load_keys(["not-a-key-but-secret-ish"], "")
    assert "secret-ish" not in str(e.value)


def test_sqlite_has_the_table(tmp_path):
    Database(f"sqlite:///{tmp_path / 'x.sqlite'}")
    names = sqlite3.connect(tmp_path / "x.sqlite").execute("select name from sqlite_master")
    assert "user_secrets" in {r[0] for r in names}


def test_a_clone_helper_on_a_swarm_gets_the_bridge_and_its_limits():
    from gpulab.runtime.swarm_specs import helper_service_spec

    base = {"image": "gpulab/sync", "command": ["git-clone"], "labels": {}}
    git = helper_service_spec(
        {**base, "host_config": {"network_mode": "bridge", "mem_limit": 4096, "pids_limit": 256}},
        "worker-1",
    )["TaskTemplate"]
    assert "Networks" not in git  # no network: the node's default bridge, never its host's
    assert git["Resources"] == {"Limits": {"MemoryBytes": 4096, "Pids": 256}}
    sync = helper_service_spec({**base, "host_config": {"network_mode": "host"}}, "worker-1")
    assert sync["TaskTemplate"]["Networks"] == [{"Target": "host"}]
    # on its owner's overlay (what the supervisor passes when networks are per user)
    own = helper_service_spec({**base, "host_config": {"network_mode": "ovl-id"}}, "worker-1")
    assert own["TaskTemplate"]["Networks"] == [{"Target": "ovl-id"}]


@pytest.mark.parametrize(
    "path, unsafe",
    [
        ("/services/gpulab/jobs/a/ports/app/x/y.js", False),
        ("/services/gpulab/jobs/a/ports/app/", False),
        ("/services/gpulab/jobs/a/ports/app/../../b/ports/tb/", True),
        ("/services/gpulab/jobs/a/ports/app/%2e%2E/x", True),
        ("/services/gpulab/jobs/a/ports/app/./x", True),
        ("/services/gpulab/jobs/a/ports/app/a%2Fb", True),
        ("/services/gpulab/jobs/a/ports/app/a%5cb", True),
        ("/services/gpulab/jobs/a/ports/app/a..b", False),
    ],
)
def test_a_port_path_that_could_leave_its_port_is_refused(path, unsafe):
    from gpulab.service.api.ports import unsafe_path

    assert unsafe_path(path) is unsafe


NS = "gpulab.j1.web."
PREFIX = "/services/gpulab/jobs/j1/ports/web/"


@pytest.mark.parametrize(
    "header, forwarded",
    [
        # the hub's, the service's (whatever their names) and the XSRF cookie stay behind
        ("jupyterhub-session-id=abc; service-gpulab=tok; _xsrf=x", ""),
        ("service-any-name=tok; __Host-jupyterhub-hub-login=z", ""),
        # the app's own cookies come back under the names it gave them
        (f"service-gpulab=tok; {NS}sid=1; {NS}theme=dark", "sid=1; theme=dark"),
        # another port's or another job's namespace is not this one's
        ("gpulab.j1.webx.sid=1; gpulab.j10.web.sid=2; gpulab.j1.sid=3", ""),
        # a malformed jar cannot carry anything along
        (f'bad"cookie; {NS}=empty-name; {NS}ok=1;;', "ok=1"),
        (f"x=1;{NS}a=b=c", "a=b=c"),
    ],
)
def test_an_app_gets_only_its_own_cookies(header, forwarded):
    from gpulab.service.api.ports import app_cookies

    assert app_cookies(header, NS) == forwarded


@pytest.mark.parametrize(
    "uri, forwarded",
    [
        ("/p/x?token=t&keep=1", "/p/x?keep=1"),
        ("/p/x?keep=a%20b&access_token=t&token=u", "/p/x?keep=a%20b"),  # (its own encoding)
        ("/p/x?%74oken=t&b=2&a=1", "/p/x?b=2&a=1"),  # tornado reads %74oken as token
        ("/p/x?token=t", "/p/x"),
        ("/p/x?tokens=1&mytoken=2", "/p/x?tokens=1&mytoken=2"),  # not the hub's argument
        ("http://hub/user/ana/lab?token=t#f", "http://hub/user/ana/lab"),  # a Referer
        ("/p/x", "/p/x"),
    ],
)
def test_no_hub_token_is_forwarded_in_a_query(uri, forwarded):
    from gpulab.service.api.ports import without_tokens

    assert without_tokens(uri) == forwarded


@pytest.mark.parametrize(
    "header, browser_gets",
    [
        ("sid=1", f"{NS}sid=1; Path={PREFIX}"),
        ("sid=1; Path=/; HttpOnly", f"{NS}sid=1; HttpOnly; Path={PREFIX}"),
        # a cookie named like the hub's cannot shadow it: it lands in the namespace too
        ("service-gpulab=evil; Path=/services/gpulab/", f"{NS}service-gpulab=evil; Path={PREFIX}"),
        (
            "a=b; Domain=example.org; Secure; SameSite=Strict; Max-Age=60",
            f"{NS}a=b; Secure; SameSite=Strict; Max-Age=60; Path={PREFIX}",
        ),  # fmt: skip
        (f"a=b; Path={PREFIX}deeper/", f"{NS}a=b; Path={PREFIX}deeper/"),
        ("a=b; Path=/services/gpulab/jobs/j1/ports/other/", f"{NS}a=b; Path={PREFIX}"),
        ("no-value-at-all", None),
        ("=nameless", None),
    ],
)
def test_an_apps_cookie_is_confined_to_its_port(header, browser_gets):
    from gpulab.service.api.ports import app_set_cookie

    assert app_set_cookie(header, NS, PREFIX) == browser_gets


# --- who may read a workload ----------------------------------------------------------------


class _Caller:
    """What BaseHandler.may_read asks of its handler: the caller's scopes."""

    def __init__(self, scopes):
        self.scopes = set(scopes)

    def is_admin(self, me):
        return BaseHandler.is_admin(self, me)

    def scopes_of(self, me):
        return self.scopes


@pytest.mark.parametrize(
    ("scopes", "owner", "may"),
    [
        ({"custom:gpulab:jobs:read"}, "alice", True),  # their own
        ({"custom:gpulab:jobs:read"}, "bob", False),  # another user's
        ({"custom:gpulab:jobs:read"}, None, False),  # everyone's
        ({ADMIN}, "bob", True),
        ({ADMIN}, None, True),
        ({ADMIN}, "alice", True),
    ],
)
def test_owner_or_admin_is_one_rule(scopes, owner, may):
    """whose (403), owned_notebook and own_job (404) all ask BaseHandler.may_read."""
    assert BaseHandler.may_read(_Caller(scopes), {"name": "alice"}, owner) is may
