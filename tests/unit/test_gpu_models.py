"""GPU models and node pools (issue 30 item 2), as data: matching, refusals, the ledger's
bookings, the scheduler's plans and a Swarm node's labels."""

from __future__ import annotations

from dataclasses import replace

import jsonschema
import pytest

from gpulab import cli
from gpulab.db import Database
from gpulab.gpus.inventory import GpuDevice, described, from_nodes, node_pools_of
from gpulab.gpus.ledger import GpuLedger, NoGpuAvailable
from gpulab.gpus.placement import Want, free_by_model, known_models, model_key, want_refusal
from gpulab.jobs.actions import Invalid, admission_refusal
from gpulab.jobs.scheduler import ActiveJob, Placement, QueuedJob, plan
from gpulab.jobs.spec import JobSpec, job_spec_schema
from gpulab.notebooks.form import refusal_text
from gpulab.notebooks.options import OptionsError, form_to_options, parse_notebook_options
from gpulab.resources import Flavor, Limits, Quota, parse_memory
from gpulab.runtime import swarm_nodes
from gpulab.runtime.base import Node
from gpulab.runtime.swarm_nodes import labelled_model, labelled_pools
from gpulab.service.pages.job_form import form_field, form_to_job

from ..support.jobspecs import CATALOG, FLAVORS, parse, refused

#: two nodes: a has two A100s (pool big), b one A100 and two T4s (pools small, cheap)
CLUSTER = [
    GpuDevice("0", "A100", node="a", pools=("big",)),
    GpuDevice("1", "A100", node="a", pools=("big",)),
    GpuDevice("0", "A100", node="b", pools=("small", "cheap")),
    GpuDevice("1", "Tesla T4", node="b", pools=("small", "cheap")),
    GpuDevice("2", "Tesla T4", node="b", pools=("small", "cheap")),
]
POOLS = {"a": ("big",), "b": ("small", "cheap")}


def test_a_model_matches_by_its_folded_name_never_a_part_of_it():
    assert model_key(" NVIDIA_A100-80GB ") == model_key("nvidia a100 80gb") == "nvidia a100 80gb"
    a100 = GpuDevice("0", "NVIDIA A100-SXM4-80GB")
    assert Want(model="nvidia a100 sxm4 80gb").matches(a100)
    assert not Want(model="A100").matches(a100)
    assert Want(pool="BIG").matches(CLUSTER[0]) and not Want(pool="big").matches(CLUSTER[2])
    assert not Want() and Want(pool="x") and Want(model="T4")
    assert known_models(CLUSTER + [GpuDevice("9", "tesla t4")]) == ["A100", "Tesla T4"]


@pytest.mark.parametrize(
    ("want", "per_worker", "workers", "expected"),
    [
        (Want(), 8, 1, None),  # no model, no pool: the count's own checks say
        (Want("A100"), 2, 1, None),
        (Want("a100"), 1, 3, None),  # three workers, one A100 each: 2 on a, 1 on b
        (Want("tesla-t4", "cheap"), 2, 1, None),
        (Want(pool="small"), 0, 1, None),  # a CPU job in a pool
        (
            Want("H100"),
            1,
            1,
            ("gpu_model", "gpu_model: no GPU of model 'H100' here; models: A100, Tesla T4"),
        ),
        (
            Want(pool="huge"),
            1,
            1,
            ("node_pool", "node_pool: no node in pool 'huge' here; pools: big, cheap, small"),
        ),
        (
            Want("Tesla T4", "big"),
            1,
            1,
            (
                "node_pool",
                "node_pool: no GPU of model 'Tesla T4' in pool 'big'; that pool has A100",
            ),
        ),
        (
            Want("A100"),
            3,
            1,
            (
                "resources.gpus",
                "3 GPU(s) of model 'A100' requested but there are at most 2 on one node: "
                "ask for 2 or fewer",
            ),
        ),
        (
            Want("A100"),
            2,
            2,
            (
                "workers",
                "2 workers of 2 GPU(s) of model 'A100' requested but at most 1 such workers "
                "fit at once (3 such GPUs, at most 2 on one node): ask for fewer workers or "
                "fewer GPUs each",
            ),
        ),
        (
            Want("T4"),
            0,
            1,
            ("gpu_model", "gpu_model: no GPU of model 'T4' here; models: A100, Tesla T4"),
        ),
        (
            Want("A100"),
            0,
            1,
            (
                "gpu_model",
                "gpu_model: 'A100' asks for a GPU model but no GPU is requested: ask for at "
                "least one GPU, or no model",
            ),
        ),
    ],
)
def test_what_no_node_could_ever_give_is_refused_naming_the_field(
    want, per_worker, workers, expected
):
    assert want_refusal(want, CLUSTER, POOLS, per_worker, workers) == expected


def test_the_admins_names_and_a_nodes_labels_describe_the_devices():
    nvml = [GpuDevice("0", "NVIDIA A100-SXM4-80GB"), GpuDevice("1", "Tesla T4")]
    named = described(nvml, {"0": "A100"}, ["lab"])
    assert [(d.model, d.pools) for d in named] == [("A100", ("lab",)), ("Tesla T4", ("lab",))]
    assert named[0].to_json() == {"id": "0", "model": "A100", "memory": "", "pools": ["lab"]}
    assert GpuDevice("0").to_json() == {"id": "0", "model": "", "memory": ""}
    nodes = [
        Node("1", "w1", True, True, ("0", "1"), gpu_model="A100", pools=("big",)),
        Node("2", "w2", True, True, ("0",)),
        Node("3", "w3", True, False, ("0",), pools=("big",)),  # drained
    ]
    devices, _ = from_nodes(nodes)
    devices = described(devices, {"w2/0": "T4", "w1/1": "A100 80GB"})
    assert [(d.key, d.model, d.pools) for d in devices] == [
        ("w1/0", "A100", ("big",)),
        ("w1/1", "A100 80GB", ("big",)),
        ("w2/0", "T4", ()),
    ]
    assert node_pools_of(nodes) == {"w1": ("big",), "w2": ()}


def test_a_swarm_nodes_labels_give_its_pools_and_model(caplog, monkeypatch):
    monkeypatch.setattr(swarm_nodes, "_WARNED", set())
    labels = {"org.gpulab.pools": " big, ,cheap,big,bad name!", "org.gpulab.gpu-model": " A100 "}
    assert labelled_pools(labels) == ("big", "cheap")
    assert labelled_model(labels) == "A100"
    assert labelled_pools({}) == () and labelled_model({}) == ""
    assert labelled_model({"org.gpulab.gpu-model": "A100; rm -rf"}) == ""
    # read at every pass: each bad value is logged once, a repeated pool never
    assert labelled_pools(labels) == ("big", "cheap")
    assert labelled_model({"org.gpulab.gpu-model": "A100; rm -rf"}) == ""
    said = [r.getMessage() for r in caplog.records if "node label" in r.getMessage()]
    assert said == [
        "node label org.gpulab.pools: 'bad name!' is no pool name; left out",
        "node label org.gpulab.gpu-model: 'A100; rm -rf' is no model name; left out",
    ]


@pytest.fixture
def ledger(tmp_path):
    db = Database(f"sqlite:///{tmp_path / 'ledger.sqlite'}")
    led = GpuLedger(db, "t", CLUSTER, "pack", ["a", "b"], sharing={"b/2": 2})
    led.node_pools = dict(POOLS)
    return led


def test_the_ledger_books_only_devices_of_the_model_and_pool_asked(ledger):
    assert ledger.reserve("w1", "u", "job", 1, want=Want("tesla t4")) == ["b/1"]
    with pytest.raises(NoGpuAvailable) as e:
        ledger.reserve("w2", "u", "job", 2, want=Want("Tesla T4"))
    assert str(e.value) == (
        "no 2 GPU(s) of model 'Tesla T4' free at once now: 1 of 2 such GPUs in use; try again "
        "later or ask for fewer"
    )
    # a gang of A100s, one each: the fullest node that fits first (pack), never a T4
    assert ledger.reserve_gang("g", "u", "job", 1, 2, want=Want("A100")) == [["b/0"], ["a/0"]]
    assert ledger.reserve("w3", "u", "job", 1, want=Want(pool="big")) == ["a/1"]
    assert ledger.reserve("w4", "u", "notebook", 0.5, want=Want("Tesla T4")) == ["b/2"]
    assert ledger.node_for_cpu(Want(pool="big")) == "a"
    assert ledger.could_fit(2, Want("A100")) and not ledger.could_fit(3, Want("A100"))
    assert ledger.could_fit(0.5, Want("T4", "cheap")) is False  # no such model
    assert ledger.want_refusal(Want("A100"), 0.5) == (
        "gpu_model",
        "no GPU of model 'A100' is shared here: ask for whole GPUs, or another model or pool",
    )
    assert ledger.known_models() == ["A100", "Tesla T4"]
    assert ledger.known_pools() == ["big", "cheap", "small"]


DEVICES = {d.key: d for d in CLUSTER}
FREE = [d.key for d in CLUSTER]


def _node(key: str) -> str:
    return key.partition("/")[0]


def test_the_plan_places_a_request_on_its_model_and_lets_others_pass():
    queued = [
        QueuedJob("t4", "u", frozenset(), 2, 50, 0.0, want=Want("tesla t4")),
        QueuedJob("h", "u", frozenset(), 1, 50, 1.0, want=Want("A100", "big")),
        QueuedJob("any", "u", frozenset(), 1, 50, 2.0),
    ]
    p = plan(queued, [], FREE, node_of=_node, devices=DEVICES)
    assert {pl.job_id: pl.devices for pl in p.start} == {
        "t4": ("b/1", "b/2"),
        "h": ("a/0",),
        "any": ("a/1",),
    }
    # the T4s busy: a T4 job waits, holding only what it could use; an A100 job passes it
    queued = [
        QueuedJob("t4", "u", frozenset(), 1, 50, 0.0, want=Want("Tesla T4")),
        QueuedJob("any", "u", frozenset(), 1, 50, 1.0),
    ]
    p = plan(queued, [], ["a/0"], node_of=_node, devices=DEVICES)
    assert [(pl.job_id, pl.devices) for pl in p.start] == [("any", ("a/0",))]
    # a gang of A100 workers, one each, over both nodes
    gang = QueuedJob("g", "u", frozenset(), 3, 50, 0.0, workers=3, want=Want("A100"))
    p = plan([gang], [], FREE, node_of=_node, devices=DEVICES)
    assert sorted(p.start[0].devices) == ["a/0", "a/1", "b/0"]


def test_only_jobs_holding_the_model_asked_are_preempted_for_it():
    borrowers = [
        ActiveJob("on-t4", "v", frozenset(), 1, True, 10, 1.0, over_quota=True, devices=("b/1",)),
        ActiveJob("on-a100", "v", frozenset(), 1, True, 10, 2.0, over_quota=True, devices=("a/0",)),
    ]
    wants = QueuedJob("w", "u", frozenset(), 1, 50, 0.0, want=Want("A100"))
    p = plan([wants], borrowers, [], node_of=_node, devices=DEVICES)
    assert p.preempt == ["on-a100"] and p.start == []
    # while it waits for the victim, the free T4 stays free for the next job
    nxt = QueuedJob("next", "u", frozenset(), 1, 50, 1.0)
    releasing = [
        ActiveJob("on-a100", "v", frozenset(), 1, True, 10, 2.0, releasing=True, devices=("a/0",))
    ]
    p = plan([wants, nxt], releasing, ["b/2"], node_of=_node, devices=DEVICES)
    assert p.preempt == [] and [pl.job_id for pl in p.start] == ["next"]


# --- what a job asks for: the spec, the flavor's rule, admission, the CLI, the form ----------

A100_FLAVOR = Flavor.from_config(
    {"id": "a100", "cpus": 2, "memory": "8G", "gpus": 1, "gpu_model": "A100", "node_pool": "big"}
)
CMD = {"command": "python train.py"}


def test_a_job_asks_for_a_model_and_a_pool_and_a_flavor_fixes_them():
    job = parse(CMD | {"gpu_model": "A100", "node_pool": "big"})
    assert (job.gpu_model, job.node_pool) == ("A100", "big")
    body = job.to_json()
    assert body["gpu_model"] == "A100" and body["node_pool"] == "big"
    assert JobSpec.from_json(body).gpu_model == "A100"
    assert job.task_spec(0).node_pool == "big"  # an array's tasks carry the request
    plain = parse(CMD).to_json()
    assert plain["gpu_model"] is None and plain["node_pool"] is None
    assert JobSpec.from_json(plain).gpu_model == ""
    flavors = FLAVORS | {"a100": A100_FLAVOR}
    fixed = parse(CMD | {"flavor": "a100"}, flavors=flavors)
    assert (fixed.gpu_model, fixed.node_pool) == ("A100", "big")
    assert parse(CMD | {"flavor": "a100", "gpu_model": "a100"}, flavors=flavors).gpu_model == (
        "A100"
    )
    refused(
        CMD | {"flavor": "a100", "gpu_model": "T4"},
        "gpu_model",
        "gpu_model: flavor 'a100' runs on 'A100': leave gpu_model out, or choose another flavor",
        flavors=flavors,
    )
    refused(CMD | {"node_pool": "no pool!"}, "node_pool", "node_pool must be a node pool's name")
    refused(CMD | {"gpu_model": 100}, "gpu_model", "must be a string")
    refused(CMD | {"gpu_model": "x" * 65}, "gpu_model", "gpu_model")
    with pytest.raises(ValueError, match="flavor 'f': gpu_model must be a GPU model's name"):
        Flavor.from_config({"id": "f", "cpus": 1, "memory": "1G", "gpu_model": "-bad"})


def test_admission_refuses_what_no_node_could_ever_give_naming_the_field(ledger):
    def admit(job):
        return admission_refusal(
            job,
            quota=Quota(),
            max_workers=8,
            max_priority=100,
            host_gpus=3,
            gpu_home="this host",
            gang_refusal=lambda per_worker, workers: None,
            want_refusal=ledger.want_refusal,
        )

    assert admit(parse(CMD | {"gpu_model": "A100", "resources": {"gpus": 2}})) is None
    why = admit(parse(CMD | {"gpu_model": "H100"}))
    assert isinstance(why, Invalid) and why.field == "gpu_model"
    assert str(why) == "gpu_model: no GPU of model 'H100' here; models: A100, Tesla T4"
    why = admit(parse(CMD | {"gpu_model": "Tesla T4", "workers": 3}))
    assert why.field == "workers" and "at most 2 such workers" in str(why)
    assert admit(parse(CMD | {"node_pool": "huge"})).field == "node_pool"


def test_the_cli_and_the_form_send_the_model_and_the_pool():
    args = cli.build_parser().parse_args(
        ["job", "run", "--gpu-model", "A100", "--node-pool", "big", "--", "true"]
    )
    body = cli.build_submission(args)
    assert body["gpu_model"] == "A100" and body["node_pool"] == "big"
    raw, errors = form_to_job({"command": "true", "gpu_model": "A100", "node_pool": ""})
    assert raw["gpu_model"] == "A100" and "node_pool" not in raw and not errors
    assert form_field("gpu_model") == "gpu_model"
    assert known_models(described(CLUSTER, {})) == ["A100", "Tesla T4"]


def test_the_schema_offers_the_known_models_and_pools():
    schema = job_spec_schema(
        catalog=CATALOG,
        flavors=FLAVORS,
        limits=Limits(cpus=4, memory=parse_memory("16G"), gpus=2),
        allowed_images=(),
        host_gpus=2,
        quota_gpus=None,
        quota_jobs=None,
        max_timeout=86400,
        gpu_models=["A100", "Tesla T4"],
        node_pools=["big"],
    )
    assert schema["properties"]["gpu_model"]["enum"] == ["A100", "Tesla T4", None, ""]
    assert schema["properties"]["node_pool"]["enum"] == ["big", None, ""]
    # what the enum offers is valid by the whole property ("" and null: absent, as the parser
    # takes them), and nothing else is
    for key, good in (("gpu_model", ["A100", None, ""]), ("node_pool", ["big", None, ""])):
        prop = jsonschema.Draft202012Validator(schema["properties"][key])
        assert [v for v in good if not prop.is_valid(v)] == []
        assert not prop.is_valid("-x") and not prop.is_valid("x" * 65)


def test_the_forms_count_free_gpus_per_model():
    rows = free_by_model(CLUSTER, {"a/0", "b/1"})
    assert rows == [
        {"model": "A100", "free": 2, "total": 3},
        {"model": "Tesla T4", "free": 1, "total": 2},
    ]


def test_notebook_options_ask_for_a_model_and_a_pool_as_a_job_does():
    limits = Limits(cpus=4, memory=parse_memory("16G"), gpus=2)
    flavors = FLAVORS | {"a100": A100_FLAVOR}

    def options(**raw):
        return parse_notebook_options(raw, CATALOG, flavors, limits, None)

    opts = options(flavor="a100")
    assert (opts.gpu_model, opts.node_pool) == ("A100", "big")
    assert opts.to_json()["gpu_model"] == "A100"
    opts = options(cpus="1", memory="1G", gpus="1", gpu_model="T4")
    assert (opts.gpu_model, opts.node_pool) == ("T4", "")
    assert options(cpus="1", memory="1G").to_json()["node_pool"] is None
    with pytest.raises(OptionsError) as e:
        options(flavor="a100", node_pool="small")
    assert e.value.field == "node_pool" and "flavor 'a100' runs on 'big'" in str(e.value)
    raw = form_to_options({"flavor": ["a100"], "gpu_model": ["A100"], "node_pool": [""]})
    assert raw == {"flavor": "a100", "gpu_model": "A100"}
    assert refusal_text("resources.gpus", "3 GPU(s) ...") == "gpus: 3 GPU(s) ..."
    assert refusal_text("gpu_model", "gpu_model: no GPU") == "gpu_model: no GPU"


def test_the_ledger_never_books_what_the_plan_held_for_a_model(tmp_path):
    """One host, two T4s before an A100: a job for 2 T4s waits for the over-quota job on one
    and holds the other; the job behind it is planned on the A100, and the ledger books that
    one, never the held T4 (the first free device)."""
    host = [GpuDevice("0", "T4"), GpuDevice("1", "T4"), GpuDevice("2", "A100")]
    led = GpuLedger(Database(f"sqlite:///{tmp_path / 'l.sqlite'}"), "t", host, "pack")
    assert led.reserve("t/job/borrower", "v", "job", 1, avoid=("0",)) == ["1"]
    borrower = ActiveJob("borrower", "v", frozenset(), 1, True, 10, 1.0, over_quota=True)
    queued = [
        QueuedJob("t4", "u", frozenset(), 2, 50, 0.0, want=Want("T4")),
        QueuedJob("any", "u", frozenset(), 1, 50, 1.0),
    ]
    devices = {d.key: d for d in led.devices}
    p = plan(queued, [replace(borrower, devices=("1",))], ["0", "2"], devices=devices)
    assert p.preempt == ["borrower"] and p.held == ["0"]
    assert p.start == [Placement("any", ("2",))]
    assert led.reserve_gang("any", "u", "job", 1, 1, avoid=p.held) == [["2"]]
    with pytest.raises(NoGpuAvailable):  # the held T4 is all that is free: not taken
        led.reserve("nb", "u", "notebook", 1, avoid=p.held)
    assert led.reserve("nb", "u", "notebook", 1) == ["0"]
