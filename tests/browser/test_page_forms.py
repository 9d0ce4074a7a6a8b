"""The job submit form's strings become a JSON job body (no browser, no hub needed)."""

from __future__ import annotations

from gpulab.jobs.gang import workers_of
from gpulab.service.pages.base import ago, gpu_total, state_class, when
from gpulab.service.pages.job_form import form_field, form_to_job


def test_form_to_job_types_and_errors():
    raw, errors = form_to_job(
        {
            "name": "t1",
            "environment": "pytorch/2.13",
            "command": " python train.py ",
            "flavor": "",
            "cpus": "0.5",
            "gpus": "1",
            "memory": "2G",
            "env": "A=1\nB=x=y\n\n",
            "volumes": "shared@local:/data:ro\n",
            "timeout": "2h",
            "retries": "3",
            "preemptible": "on",
        }
    )
    assert errors == {}
    assert raw == {
        "name": "t1",
        "framework": "pytorch",
        "version": "2.13",
        "command": "python train.py",
        "resources": {"cpus": 0.5, "gpus": 1, "memory": "2G"},
        "env": {"A": "1", "B": "x=y"},
        "volumes": ["shared@local:/data:ro"],
        "timeout": "2h",
        "retries": 3,
        "preemptible": True,
    }
    _, errors = form_to_job({"command": "", "gpus": "1.5", "retries": "x", "env": "NOEQUALS"})
    assert set(errors) == {"command", "gpus", "retries", "env"}


def test_form_workers():
    raw, errors = form_to_job({"command": "python ddp.py", "workers": " 4 "})
    assert errors == {} and raw["workers"] == 4
    raw, errors = form_to_job({"command": "true", "workers": ""})
    assert errors == {} and "workers" not in raw
    # out of range is the API's to refuse (field workers); not a number is the form's
    raw, errors = form_to_job({"command": "true", "workers": "0"})
    assert errors == {} and raw["workers"] == 0
    _, errors = form_to_job({"command": "true", "workers": "two"})
    assert errors == {"workers": "workers must be a whole number from 1 to 64, not 'two'"}
    assert form_field("workers") == "workers"


def test_form_terminate_after_preemption():
    raw, errors = form_to_job(
        {"command": "true", "preemptible": "on", "terminate_after_preemption": "on"}
    )
    assert errors == {} and raw["terminate_after_preemption"] is True
    raw, _ = form_to_job({"command": "true"})
    assert "terminate_after_preemption" not in raw
    assert form_field("terminate_after_preemption") == "terminate_after_preemption"
    raw, _ = form_to_job({"command": "true", "auto_delete_after": " 30d "})
    assert raw["auto_delete_after"] == "30d"
    assert form_field("auto_delete_after") == "auto_delete_after"


def test_form_notify():
    raw, errors = form_to_job(
        {
            "command": "true",
            "notify_webhook": " https://hooks.example.org/x ",
            "notify_failed": "on",
            "notify_preempted": "on",
        }
    )
    assert errors == {}
    assert raw["notify"] == {
        "webhook": "https://hooks.example.org/x",
        "on": ["failed", "preempted"],
    }
    raw, _ = form_to_job({"command": "true", "notify_email": "ann@example.org"})
    assert raw["notify"] == {"email": "ann@example.org"}  # none ticked: the API's default, all
    raw, _ = form_to_job({"command": "true", "notify_done": "on"})
    assert raw["notify"] == {"on": ["done"]}  # for the API to refuse: it names no one
    assert "notify" not in form_to_job({"command": "true"})[0]
    assert form_field("notify.webhook") == "notify_webhook"
    assert form_field("notify.on") == "notify_on"
    assert form_field("notify") == "notify_webhook"


def test_gpus_in_all():
    one = {"spec": {"resources": {"gpus": 2}}}
    assert workers_of(one) == 1 and gpu_total(one) == "2"
    gang = {"spec": {"workers": 3, "resources": {"gpus": 2}}}
    assert workers_of(gang) == 3 and gpu_total(gang) == "6 (3 workers × 2)"
    assert gpu_total({"spec": {}}) == "—"


def test_spec_fields_map_to_form_fields():
    assert form_field("resources.gpus") == "gpus"
    assert form_field("env.FOO") == "env"
    assert form_field("volumes[0]") == "volumes"
    assert form_field("version") == "environment"
    assert form_field(None) == "form"


def test_filters():
    assert when("2024-05-01T10:00:00.123Z") == "2024-05-01 10:00:00"
    assert when(None) == "—" and ago(None) == ""
    assert state_class("DONE") == "ok" and state_class("FAILED") == "bad"


def test_form_sweep():
    raw, errors = form_to_job(
        {
            "command": "python t.py",
            "completions": " 3 ",
            "parallelism": "2",
            "parameters": '[{"lr": 0.1}, {"lr": 0.01}, {"lr": 0.001}]',
        }
    )
    assert errors == {}
    assert (raw["completions"], raw["parallelism"]) == (3, 2)
    assert raw["parameters"] == [{"lr": 0.1}, {"lr": 0.01}, {"lr": 0.001}]
    raw, errors = form_to_job({"command": "true", "completions": "", "parameters": " "})
    assert errors == {} and not {"completions", "parallelism", "parameters"} & set(raw)
    _, errors = form_to_job({"command": "true", "parallelism": "two", "parameters": "[{"})
    assert set(errors) == {"parallelism", "parameters"}
    assert errors["parameters"].startswith("write a JSON list of objects")
    # the API's refusals land next to their field
    assert form_field("parameters[2].lr") == "parameters"
    assert form_field("completions") == "completions"
