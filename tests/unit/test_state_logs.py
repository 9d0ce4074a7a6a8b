"""The state-change log line: its fields, the message's cap and redaction (pure), and that
the records' compare-and-sets write one line per committed change (a SQLite file)."""

from __future__ import annotations

import json
import logging

import pytest

from gpulab import statelog
from gpulab.statelog import MESSAGE_CAP, REDACTED, clean_message, format_change, redact


def test_the_line_carries_id_owner_states_reason_and_the_fields():
    line, fields = format_change(
        "job", "j3f2a", "alice", "QUEUED", "INITIALIZING", "SCHEDULED", "placed on node1", None
    )
    assert line == (
        'job j3f2a owner=alice QUEUED->INITIALIZING reason=SCHEDULED message="placed on node1"'
    )
    assert fields == {
        "workload": "job",
        "workload_id": "j3f2a",
        "owner": "alice",
        "old_state": "QUEUED",
        "state": "INITIALIZING",
        "reason": "SCHEDULED",
        "detail": "placed on node1",
        "exit_code": None,
    }
    # a creation has no old state; an exit code is shown; odd owners are quoted
    line, fields = format_change("notebook", "bob/_default", "bob x", None, "STARTING")
    assert line == 'notebook bob/_default owner="bob x" -->STARTING'
    assert fields["old_state"] == "" and fields["detail"] == ""
    line, _ = format_change("job", "j1", "a", "RUNNING", "FAILED", "EXIT", "", 3)
    assert line == "job j1 owner=a RUNNING->FAILED reason=EXIT exit_code=3"


def test_messages_are_one_line_and_capped():
    long = "x" * (MESSAGE_CAP + 50)
    assert clean_message(long) == "x" * MESSAGE_CAP + "... (+50 chars)"
    assert clean_message("two\nlines\r\n\tand  spaces") == "two lines and spaces"
    line, fields = format_change("job", "j1", "a", "RUNNING", "FAILED", "E", "a\nb" + long)
    assert "\n" not in line and len(fields["detail"]) < MESSAGE_CAP + 30
    # a forged line in a message stays inside the quoted message
    line, _ = format_change("job", "j1", "a", "RUNNING", "FAILED", "E", 'x"\njob j2 owner=b')
    assert line.count("\n") == 0 and line.endswith('message="x\\" job j2 owner=b"')


@pytest.mark.parametrize(
    ("text", "hidden"),
    [
        ("exec failed: WANDB_API_KEY=wandb-k3y-x7x7 not found", "wandb-k3y-x7x7"),
        ('env MY_DB="hunter 2 x" refused', "hunter 2 x"),
        ("Authorization: token 0123456789abcdef", "0123456789abcdef"),
        ("sent bearer abcdefghijklmnop0123", "abcdefghijklmnop0123"),
        ("password: s3cr3t-pass, retry", "s3cr3t-pass"),
        ("aws_secret_access_key=abc/def+ghi", "abc/def+ghi"),
        ("key AKIAABCDEFGHIJKLMNOP is unknown", "AKIAABCDEFGHIJKLMNOP"),
    ],
)
def test_credential_shapes_are_redacted(text, hidden):
    out = redact(text)
    assert hidden not in out and REDACTED in out


def test_ordinary_text_is_kept():
    for text in (
        "the job's token expired",
        "secret wandb is missing: gpulab secret set wandb",
        "exit code 137 (killed: out of memory)",
        "pull of datasets@s3/imagenet failed: 3 objects",
    ):
        assert redact(text) == text


def test_registered_values_are_redacted_wherever_they_appear():
    statelog.register_sensitive(["svc-token-0123456789", None, "short"])
    try:
        out = clean_message("hub answered 403 for svc-token-0123456789?x=1 (short)")
        assert "svc-token-0123456789" not in out and REDACTED in out
        assert "(short)" in out  # too short to be searched for
    finally:
        statelog._sensitive.discard("svc-token-0123456789")


def test_json_formatter_emits_the_fields():
    record = logging.LogRecord("gpulab.state", logging.INFO, __file__, 1, "%s", ("l",), None)
    _, fields = format_change("job", "j1", "alice", "QUEUED", "RUNNING", "STARTED", "ok")
    record.__dict__.update(fields)
    out = json.loads(statelog.json_formatter().format(record))
    assert out["message"] == "l" and out["logger"] == "gpulab.state" and out["level"] == "INFO"
    assert {k: out[k] for k in fields} == fields


# -- the records write one line per committed change ---------------------------------------


def _state_lines(caplog) -> list[logging.LogRecord]:
    return [r for r in caplog.records if r.name == "gpulab.state"]


def test_job_records_log_each_committed_transition_once(tmp_path, caplog):
    from gpulab.db import Database
    from gpulab.jobs.records import JobRecords
    from gpulab.lifecycle import InvalidTransition, JobState

    caplog.set_level(logging.INFO, logger="gpulab.state")
    records = JobRecords(Database(f"sqlite:///{tmp_path / 'g.sqlite'}"), "t")
    job = records.create("alice", {"env": {"K": "v-not-logged"}}, None)
    records.transition(job["id"], JobState.INITIALIZING, expect=JobState.QUEUED, reason="SCHEDULED")
    with pytest.raises(InvalidTransition):  # lost race: nothing changed, nothing logged
        records.transition(job["id"], JobState.RUNNING, expect=JobState.QUEUED)
    records.transition(
        job["id"],
        JobState.FAILED,
        expect=JobState.INITIALIZING,
        reason="PULL_FAILED",
        message="volume data: TOKEN=abc123def failed",
        exit_code=1,
    )
    lines = _state_lines(caplog)
    assert [(r.old_state, r.state, r.reason) for r in lines] == [
        ("", "QUEUED", "SUBMITTED"),
        ("QUEUED", "INITIALIZING", "SCHEDULED"),
        ("INITIALIZING", "FAILED", "PULL_FAILED"),
    ]
    assert all(r.workload == "job" and r.workload_id == job["id"] for r in lines)
    assert all(r.owner == "alice" for r in lines)
    assert lines[-1].exit_code == 1 and "abc123def" not in lines[-1].getMessage()
    assert "v-not-logged" not in caplog.text


def test_notebook_records_log_each_committed_transition_once(tmp_path, caplog):
    from gpulab.db import Database
    from gpulab.lifecycle import InvalidTransition, NotebookState
    from gpulab.notebooks.records import LimitExceeded, NotebookRecords
    from gpulab.resources import Limits, Resources

    caplog.set_level(logging.INFO, logger="gpulab.state")
    records = NotebookRecords(Database(f"sqlite:///{tmp_path / 'n.sqlite'}"), "t")
    limits = Limits(cpus=2, memory=4 << 30, gpus=0)
    one = Resources(cpus=1, memory=1 << 30, gpus=0)
    records.start("bob", "", one, limits, options={"resources": one.to_json()})
    records.transition("bob", "", NotebookState.RUNNING, reason="READY")
    with pytest.raises(InvalidTransition):
        records.transition(
            "bob", "", NotebookState.STOPPED, expect=frozenset({NotebookState.STOPPING})
        )
    with pytest.raises(LimitExceeded):  # refused: STARTING then FAILED, both committed
        records.start("bob", "big", Resources(cpus=2, memory=1 << 30, gpus=0), limits)
    lines = _state_lines(caplog)
    assert [(r.workload_id, r.old_state, r.state, r.reason) for r in lines] == [
        ("bob/_default", "", "STARTING", ""),
        ("bob/_default", "STARTING", "RUNNING", "READY"),
        ("bob/big", "", "STARTING", ""),
        ("bob/big", "STARTING", "FAILED", "LIMIT_EXCEEDED"),
    ]
    assert all(r.owner == "bob" and r.workload == "notebook" for r in lines)
