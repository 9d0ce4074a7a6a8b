"""Job arrays (sweeps) as data: the submission's fields (completions, parallelism,
parameters), what each task is told, the array's state derived from its tasks', and the
scheduler's rule (at most ``parallelism`` tasks of an array at once; an array counts as one
job against the quota). The supervisor's side, on the fake engine: tests/unit/test_supervisor.py."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest

from gpulab.checks import key_text
from gpulab.jobs.scheduler import ActiveJob, QueuedJob, plan
from gpulab.jobs.spec import JOB_SPEC_SCHEMA, JobSpec, JobSpecError
from gpulab.jobs.spec.array import MAX_COMPLETIONS, Task, task_env
from gpulab.jobs.states import array_state
from gpulab.lifecycle import JobState
from gpulab.notices import Notify
from gpulab.resources import Quota

from ..support.jobspecs import parse as parse_body

J = JobState


def parse(raw: dict) -> JobSpec:
    return parse_body({"command": ["python", "t.py"], **raw})


# --- the submission ----------------------------------------------------------------------------


def test_a_plain_job_is_no_array():
    spec = parse({})
    assert (spec.completions, spec.parallelism, spec.parameters, spec.task) == (None,) * 4
    assert not spec.is_array
    assert parse(spec.to_json()) == spec


def test_completions_and_parallelism():
    spec = parse({"completions": 10, "parallelism": 3})
    assert spec.is_array and (spec.completions, spec.parallelism) == (10, 3)
    assert parse({"completions": 4}).parallelism == 4  # default: every task at once
    assert parse({"completions": 4.0, "parallelism": 2.0}).parallelism == 2
    assert parse(spec.to_json()) == spec  # a rerun submits the array again
    assert JobSpec.from_json(spec.to_json()) == spec


def test_parameters_give_completions_and_each_task_its_set():
    sets = [{"lr": 0.01, "model": "resnet18"}, {"lr": 1e-5, "model": "vit", "seed": 3}]
    spec = parse({"parameters": sets, "parallelism": 1})
    assert spec.completions == 2 and spec.parallelism == 1
    assert parse({"parameters": sets, "completions": 2}).completions == 2
    task = spec.task_spec(1)
    assert task.task == Task(1, sets[1]) and task.parameters is None  # the list stays
    assert not task.is_array and task.completions == 2
    told = replace(spec, notify=Notify(webhook="http://127.0.0.1/h"))
    assert told.task_spec(0).notify is None  # the array's end is told, once
    assert JobSpec.from_json(task.to_json()) == task
    env = task_env(Task(1, sets[1], array="jabc"), 2)
    assert env == {
        "GPULAB_ARRAY_ID": "jabc",
        "GPULAB_TASK_INDEX": "1",
        "GPULAB_TASK_COUNT": "2",
        "GPULAB_TASK_PARAMS": '{"lr":1e-05,"model":"vit","seed":3}',
        "GPULAB_PARAM_LR": "1e-05",
        "GPULAB_PARAM_MODEL": "vit",
        "GPULAB_PARAM_SEED": "3",
    }
    assert json.loads(env["GPULAB_TASK_PARAMS"]) == sets[1]
    # without parameters: the index alone, and an empty set
    assert task_env(parse({"completions": 3}).task_spec(2).task, 3)["GPULAB_TASK_PARAMS"] == "{}"
    # a task's spec is not a submission: a task is rerun with its array
    with pytest.raises(JobSpecError) as e:
        parse(task.to_json())
    assert e.value.field == "task"


@pytest.mark.parametrize(
    "raw, field, says",
    [
        ({"completions": 0}, "completions", "from 1 to 1000"),
        ({"completions": MAX_COMPLETIONS + 1}, "completions", "from 1 to 1000"),
        ({"completions": "3"}, "completions", "whole number"),
        ({"completions": True}, "completions", "whole number"),
        ({"completions": 2.5}, "completions", "whole number"),
        ({"parallelism": 2}, "parallelism", "needs completions or parameters"),
        ({"completions": 3, "parallelism": 4}, "parallelism", "from 1 to 3"),
        ({"completions": 3, "parallelism": 0}, "parallelism", "from 1 to 3"),
        ({"parameters": []}, "parameters", "non-empty list"),
        ({"parameters": {"lr": 1}}, "parameters", "non-empty list"),
        ({"parameters": [{"a": 1}] * (MAX_COMPLETIONS + 1)}, "parameters", "at most 1000"),
        ({"parameters": [{"a": 1}, {"a": 2}], "completions": 3}, "completions", "must equal"),
        ({"parameters": [1]}, "parameters[0]", "must be an object"),
        ({"parameters": [{"a": 1}, {"1a": 1}]}, "parameters[1].1a", "not starting with a digit"),
        ({"parameters": [{"a-b": 1}]}, "parameters[0].a-b", "letters, digits and '_'"),
        ({"parameters": [{"x" * 65: 1}]}, "parameters[0]." + key_text("x" * 65), "1 to 64"),
        ({"parameters": [{"lr": 1, "LR": 2}]}, "parameters[0].LR", "GPULAB_PARAM_LR"),
        ({"parameters": [{"a": True}]}, "parameters[0].a", "string or a number"),
        ({"parameters": [{"a": None}]}, "parameters[0].a", "string or a number"),
        ({"parameters": [{"a": [1]}]}, "parameters[0].a", "string or a number"),
        ({"parameters": [{"a": float("nan")}]}, "parameters[0].a", "finite"),
        ({"parameters": [{"a": "x\0"}]}, "parameters[0].a", "NUL"),
        ({"parameters": [{"a": "x" * 1025}]}, "parameters[0].a", "at most 1024"),
        ({"parameters": [{f"k{i}": 1 for i in range(33)}]}, "parameters[0]", "at most 32 keys"),
        ({"parameters": [{f"k{i}": "v" * 200 for i in range(30)}]}, "parameters[0]", "4 KiB"),
        ({"parameters": [{"k": "v" * 1000}] * 300}, "parameters", "256 KiB"),
    ],
)
def test_bad_array_fields_are_refused_naming_the_field(raw, field, says):
    with pytest.raises(JobSpecError) as e:
        parse(raw)
    assert e.value.field == field and says in str(e.value), str(e.value)


def test_the_schema_agrees_on_examples():
    jsonschema = pytest.importorskip("jsonschema")
    v = jsonschema.Draft202012Validator(JOB_SPEC_SCHEMA)
    for body in (
        {"command": ["x"], "completions": 3, "parallelism": 2},
        {"command": ["x"], "parameters": [{"lr": 0.1, "name": "a"}, {"_k": 2}]},
    ):
        assert v.is_valid(body), body
        parse(body)
    for body in (
        {"command": ["x"], "completions": 0},
        {"command": ["x"], "completions": 1001},
        {"command": ["x"], "parameters": []},
        {"command": ["x"], "parameters": [{"1a": 1}]},
        {"command": ["x"], "parameters": [{"a": True}]},
        {"command": ["x"], "parameters": [{"a": None}]},
    ):
        assert not v.is_valid(body), body
        with pytest.raises(JobSpecError):
            parse(body)


def test_a_parameter_cannot_reach_gpulabs_own_variables():
    # every parameter's variable carries the GPULAB_PARAM_ prefix; a job's env and secrets
    # may set no GPULAB_ name at all; so a set cannot override the index, the id or a secret
    env = task_env(Task(0, {"TASK_INDEX": "9", "JOB_ID": "x"}, "j1"), 1)
    assert env["GPULAB_TASK_INDEX"] == "0"
    assert env["GPULAB_PARAM_TASK_INDEX"] == "9" and "GPULAB_JOB_ID" not in env
    with pytest.raises(JobSpecError) as e:
        parse({"completions": 2, "env": {"GPULAB_TASK_INDEX": "5"}})
    assert e.value.field == "env.GPULAB_TASK_INDEX"


# --- the array's state, from its tasks' --------------------------------------------------------


@pytest.mark.parametrize(
    "tasks, stopping, state, reason, code",
    [
        ([(0, "QUEUED", None), (1, "QUEUED", None)], False, J.QUEUED, "SUBMITTED", None),
        ([(0, "INITIALIZING", None), (1, "QUEUED", None)], False, J.RUNNING, "TASKS", None),
        ([(0, "DONE", 0), (1, "QUEUED", None)], False, J.RUNNING, "TASKS", None),
        ([(0, "RUNNING", None), (1, "QUEUED", None)], True, J.INTERRUPTING, "USER_INTERRUPT", None),
        ([(0, "DONE", 0), (1, "DONE", 0)], False, J.DONE, "TASKS_DONE", 0),
        ([(1, "FAILED", 3), (0, "FAILED", 2), (2, "DONE", 0)], False, J.FAILED, "TASK_FAILED", 2),
        ([(0, "ERROR", None), (1, "INTERRUPTED", 143)], False, J.ERROR, "TASK_ERROR", None),
        ([(0, "SYNC_FAILED", 0), (1, "DONE", 0)], False, J.SYNC_FAILED, "TASK_SYNC_FAILED", None),
        (
            [(0, "INTERRUPTED", None), (1, "DONE", 0)],
            False,
            J.INTERRUPTED,
            "TASK_INTERRUPTED",
            None,
        ),
        ([(0, "INTERRUPTED", None), (1, "FAILED", 1)], True, J.INTERRUPTED, "USER_INTERRUPT", None),
    ],
)
def test_an_arrays_state_is_derived_from_its_tasks(tasks, stopping, state, reason, code):
    got = array_state(tasks, stopping)
    assert got[0] is state and got[1] == reason and got[3] == code, got


def test_an_arrays_message_counts_its_tasks():
    tasks = [(0, "DONE", 0), (1, "RUNNING", None), (2, "QUEUED", None), (3, "QUEUED", None)]
    assert array_state(tasks, False)[2] == "4 tasks: 2 QUEUED, 1 RUNNING, 1 DONE"
    failed = [(0, "FAILED", 1), (1, "FAILED", 1), (2, "DONE", 0)]
    assert array_state(failed, False)[2] == "2 tasks FAILED, the first task 0; 1 DONE, 2 FAILED"


# --- the scheduler's rule ----------------------------------------------------------------------


def task(id, array="A", parallelism=2, gpus=1, owner="ann", t=0.0, preemptible=False):
    return QueuedJob(
        id, owner, frozenset(), gpus, 50, t, preemptible, array=array, parallelism=parallelism
    )


def running(id, array="A", gpus=1, owner="ann", over=False, releasing=False):
    return ActiveJob(
        id, owner, frozenset(), gpus, over, 50, 0.0, over, releasing=releasing, array=array
    )


def started(p) -> list[str]:
    return [s.job_id for s in p.start]


def test_at_most_parallelism_tasks_of_an_array_start():
    queued = [task(f"t{i}", t=i) for i in range(5)]
    assert started(plan(queued, [], ["0", "1", "2", "3"])) == ["t0", "t1"]
    # active ones count, releasing ones too (their containers still run)
    assert started(plan(queued, [running("r0")], ["0", "1", "2"])) == ["t0"]
    assert started(plan(queued, [running("r0"), running("r1", releasing=True)], ["0"])) == []
    # other arrays and plain jobs are not held back
    other = [task("b0", array="B", parallelism=1), QueuedJob("p", "ann", frozenset(), 1, 50, 9.0)]
    p = plan([*queued, *other], [running("r0"), running("r1")], ["0", "1", "2", "3"])
    assert started(p) == ["b0", "p"]


def test_a_task_waiting_for_its_turn_holds_nothing_and_preempts_nothing():
    borrowers = [running("x", array="", owner="bob", over=True)]
    p = plan([task("t1", parallelism=1)], [running("t0", gpus=0), *borrowers], [])
    assert p.preempt == [] and p.start == []
    queued = [task("t1", parallelism=1), QueuedJob("p", "cid", frozenset(), 1, 40, 5.0)]
    p = plan(queued, [running("t0", gpus=0)], ["0"])
    assert started(p) == ["p"]  # the free GPU goes to the next job in line


def test_an_array_counts_as_one_job_against_the_quota():
    quota = Quota(gpus=None, jobs=2)
    queued = [task(f"t{i}", parallelism=4, t=i) for i in range(4)]
    queued.append(QueuedJob("p1", "ann", frozenset(), 1, 50, 10.0))
    queued.append(QueuedJob("p2", "ann", frozenset(), 1, 50, 11.0))
    p = plan(queued, [running("r", array="B")], list("0123456"), default_quota=quota)
    # array B is one job, array A another: the quota's 2 are taken; A's tasks all start
    assert started(p) == ["t0", "t1", "t2", "t3"]
    p = plan(queued, [], list("0123456"), default_quota=quota)
    assert started(p) == ["t0", "t1", "t2", "t3", "p1"]
    # GPUs still count per task
    p = plan(queued, [], list("0123456"), default_quota=Quota(gpus=3, jobs=None))
    assert started(p) == ["t0", "t1", "t2"]


def test_over_quota_tasks_keep_to_their_parallelism():
    queued = [task(f"t{i}", parallelism=2, preemptible=True, t=i) for i in range(4)]
    p = plan(queued, [], ["0", "1", "2", "3"], default_quota=Quota(gpus=0, jobs=None))
    assert started(p) == ["t0", "t1"] and all(s.over_quota for s in p.start)


def test_the_sites_cap_on_tasks():
    refused_ = [({"completions": 4}, "completions"), ({"parameters": [{}] * 4}, "parameters")]
    for raw, field in refused_:
        with pytest.raises(JobSpecError) as e:
            parse_body({"command": ["x"], **raw}, max_tasks=3)
        assert e.value.field == field and "3" in str(e.value)
    assert parse_body({"command": ["x"], "completions": 3}, max_tasks=3).completions == 3


# --- the pages: the job page's tasks table, a task's array, the list's row ---------------------


def test_the_job_page_shows_an_arrays_tasks_and_a_tasks_array(tmp_path):
    from gpulab.db import Database
    from gpulab.jobs.records import JobRecords
    from gpulab.service.pages.base import _env

    records = JobRecords(Database(f"sqlite:///{tmp_path / 'db.sqlite'}"), "t")
    spec = parse({"parameters": [{"lr": 0.1}, {"lr": 0.01}], "parallelism": 1})
    tasks = [spec.task_spec(i).to_json() for i in range(2)]
    array = records.create("ann", spec.to_json(), "sweep", (), tasks=tasks)
    array = records.get(array["id"])
    task = records.get(array["tasks"][1]["id"])
    page = _env.get_template("job.html")
    common = dict(
        prefix="/p/", static="/s/", xsrf_form_html=lambda: "", workers=1, first_rank="",
        ended_states=["DONE"], can_manage=True, api="/api", me={"name": "ann"}, hub="/h/",
        request_path="/p/jobs", users_prefix="/u/", is_admin=False, xsrf_token="",
    )  # fmt: skip
    html = page.render(job=array, ended=False, **common)
    assert 'id="tasks-card"' in html and 'id="logs-card"' not in html
    assert f'href="/p/jobs/{task["id"]}"' in html and '{"lr": 0.01}' in html
    assert "2, at most 1 at once: 2 QUEUED" in html and 'id="action-rerun"' in html
    html = page.render(job=task, ended=False, **common)
    assert f'href="/p/jobs/{array["id"]}">{array["id"]}</a>, task 1 of 2' in html
    assert 'id="logs-card"' in html and 'id="action-rerun"' not in html
    rows, _ = records.page("ann", None, None, 10, 0)
    listed = str(_env.get_template("_macros.html").module.job_table(rows, "/p/"))
    assert "2 tasks · 2 QUEUED" in listed
