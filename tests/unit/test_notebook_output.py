"""A notebook's output and labels as its owner reads them: the tail of its container's log
(bounded, scrubbed of credentials, refused when there is no container) and the list of its
records filtered on labels."""

from __future__ import annotations

import base64

import pytest
from sqlalchemy import delete

from gpulab.db import Database, Notebook, NotebookEvent
from gpulab.errors import FieldError
from gpulab.lifecycle import NotebookState as S
from gpulab.notebooks import output
from gpulab.notebooks.output import NoOutput, read_output, tail_lines
from gpulab.notebooks.records import NotebookRecords, notebook_cursor, parse_notebook_cursor
from gpulab.runtime.base import WorkloadSpec

from ..support.fake_runtime import FakeRuntime, FakeWorkload

RECORD = {"user": "ann", "server": "nb", "state": "RUNNING", "container": "gl-nb-ann-nb"}


def engine(log: bytes) -> FakeRuntime:
    rt = FakeRuntime()
    name = RECORD["container"]
    rt.workloads[name] = FakeWorkload(WorkloadSpec(name=name, image="i", command=[]), logs=log)
    return rt


def test_the_tail_is_the_last_lines_scrubbed_of_credentials():
    log = b"".join(b"line %d\n" % i for i in range(500)) + (
        b"[I 10:00:01 ServerApp] 101 GET /user/ann/nb/api/kernels/k/channels"
        b"?session_id=s&token=abcdef123 (ann@10.0.0.1) 2.00ms\n"
        b"Authorization: token deadbeef\n"
        b"caf\xc3\xa9 \xff\n"
    )
    text = read_output(engine(log), RECORD, 5).decode()
    lines = text.splitlines()
    assert lines[:2] == ["line 498", "line 499"]
    assert "token=[secret]" in lines[2] and "abcdef123" not in text
    assert lines[3] == "Authorization: token [secret]"
    assert lines[4] == "café \ufffd"  # not UTF-8: replaced, never a failure
    assert read_output(engine(log), RECORD, 10_000).decode().startswith("line 0\n")


def test_the_tail_is_capped_in_bytes(monkeypatch):
    monkeypatch.setattr(output, "MAX_TAIL_BYTES", 100)
    text = read_output(engine(b"".join(b"line %d\n" % i for i in range(1000))), RECORD, 1000)
    assert len(text) <= 100 and text.endswith(b"line 999\n") and text.startswith(b"line ")


def test_no_container_says_why():
    with pytest.raises(NoOutput, match=r"nb of ann has no container now \(STOPPED\)"):
        read_output(FakeRuntime(), {**RECORD, "state": "STOPPED"}, 10)
    with pytest.raises(NoOutput, match=r"\(default\) of ann has no container yet"):
        read_output(FakeRuntime(), {**RECORD, "server": "", "container": ""}, 10)


@pytest.mark.parametrize("raw", ["0", "10001", "-1", "x", "1.5", "", " 5", "\u0665", "9" * 40])
def test_tail_is_a_count_of_lines(raw):
    with pytest.raises(FieldError) as e:
        tail_lines(raw)
    assert e.value.field == "tail" and "from 1 to 10000" in str(e.value)


def test_tail_default_and_bounds():
    assert tail_lines(None) == 200
    assert tail_lines("1") == 1 and tail_lines("10000") == 10_000


def test_the_list_filters_on_labels(tmp_path):
    records = NotebookRecords(Database(f"sqlite:///{tmp_path / 'n.sqlite'}"), "t")
    for user, server, labels in (
        ("ann", "a", {"team": "vision"}),
        ("ann", "b", {"team": "nlp"}),
        ("ann", "c", {"team": "vision", "run": "2"}),
        ("ann", "d", None),
        ("bob", "a", {"team": "vision"}),
    ):
        options = {"labels": labels} if labels is not None else {}
        records.transition(user, server, S.STARTING, options=options)

    def servers(user, labels=None, limit=10, offset=0):
        rows, total = records.page(user, limit, offset, labels)
        return [r["server"] for r in rows], total

    assert servers("ann") == (["a", "b", "c", "d"], 4)
    assert servers("ann", {"team": "vision"}) == (["a", "c"], 2)
    assert servers("ann", {"team": "vision", "run": "2"}) == (["c"], 1)
    assert servers("ann", {"team": "other"}) == ([], 0)
    assert servers("ann", {"team": "vision"}, limit=1, offset=1) == (["c"], 2)
    assert servers(None, {"team": "vision"}) == (["a", "c", "a"], 3)
    assert records.get("ann", "c")["options"]["labels"] == {"team": "vision", "run": "2"}


def test_the_list_pages_by_cursor_through_every_notebook_once(tmp_path):
    """GET /api/notebooks's pages (issue #32: every list by cursor): each page starts after
    the last row of the one before, however many rows went before it meanwhile; the total
    counts them all; with labels, only the labelled ones; a cursor not given is refused."""
    records = NotebookRecords(Database(f"sqlite:///{tmp_path / 'n.sqlite'}"), "t")
    made = []
    for user in ("ann", "bob", "cy"):
        for server in ("", "a", "b"):
            labels = {"team": "vision"} if server != "a" else {}
            records.transition(user, server, S.STARTING, options={"labels": labels})
            made.append((user, server))

    def walk(size, labels=None):
        walked, after = [], None
        while True:
            rows, total = records.page(None, size + 1, 0, labels, after)
            more, rows = len(rows) > size, rows[:size]
            walked += [(r["user"], r["server"]) for r in rows]
            if not more:
                return walked, total
            after = parse_notebook_cursor(notebook_cursor(rows[-1]))

    for size in (1, 2, 4, 20):
        assert walk(size) == (made, 9), size
        assert walk(size, {"team": "vision"}) == ([m for m in made if m[1] != "a"], 6), size
    # the row a cursor names went meanwhile: the next page starts after where it was
    rows, _ = records.page(None, 2, 0, None, None)
    cursor = notebook_cursor(rows[-1])  # ("ann", "a")
    with records.db.session() as s:  # (a removed user's rows)
        s.execute(delete(NotebookEvent))
        s.execute(delete(Notebook).where(Notebook.user == "ann", Notebook.server == "a"))
    rows, total = records.page(None, 2, 0, None, parse_notebook_cursor(cursor))
    assert [(r["user"], r["server"]) for r in rows] == [("ann", "b"), ("bob", "")]
    assert total == 8
    surrogate = base64.urlsafe_b64encode(b'["\\ud800","x"]').decode()  # no name is one
    for bad in ("", "x" * 2000, "bm90IGpzb24", "WzEsMl0", "WyJhIl0", surrogate):
        with pytest.raises(ValueError, match="cursor"):  # not json, [1,2], ["a"]
            parse_notebook_cursor(bad)
