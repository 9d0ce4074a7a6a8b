"""The field checks both doors share (gpulab.checks): a notebook's options and a job's spec
refuse the same fault in the same words."""

import pytest

from gpulab import checks
from gpulab.errors import FieldError
from gpulab.jobs.spec import JobSpecError
from gpulab.notebooks.options import OptionsError, parse_notebook_options

from ..support.jobspecs import CATALOG, FLAVORS, LIMITS, STORAGE, parse

CMD = {"command": ["python", "train.py"]}


def job_refusal(raw):
    with pytest.raises(JobSpecError) as e:
        parse(CMD | raw)
    return e.value.field, str(e.value)


def notebook_refusal(raw, **kw):
    with pytest.raises(OptionsError) as e:
        parse_notebook_options(
            raw, CATALOG, FLAVORS, LIMITS, "cpu-small", storage=STORAGE, user="ann", **kw
        )
    return e.value.field, str(e.value)


@pytest.mark.parametrize(
    "raw",
    [
        {"framework": "cobol"},
        {"framework": "python", "version": "0.1"},
        {"cpus": 64},
        {"volumes": ["x" * 2000]},
        {"volumes": [f"datasets@s3/{i}:/data/{i}:ro" for i in range(40)]},
        {"volumes": ["secret@s3:/data:ro"]},
        {"labels": ["a"]},
        {"labels": {"Team": "x"}},
        {"labels": {"org.gpulab.user": "bob"}},
        {"labels": {"team": "x" * 64}},
        {"labels": {"team": 3}},
        {"labels": {f"k{i}": "v" for i in range(65)}},
    ],
)
def test_both_doors_refuse_alike(raw):
    job = dict(raw)
    if "cpus" in job:
        job = {"resources": {"cpus": job.pop("cpus")}}
    field, message = notebook_refusal(raw)
    job_field, job_message = job_refusal(job)
    assert message == job_message
    assert job_field in (field, f"resources.{field}")


def test_a_flag_and_an_image_keep_each_doors_words():
    # the spawn form posts "on"; the JSON door takes a boolean only
    assert checks.flag(FieldError, "auto_restart", "on", words=True) is True
    assert notebook_refusal({"auto_restart": "maybe"}) == (
        "auto_restart",
        "auto_restart must be true or false, not 'maybe'",
    )
    assert job_refusal({"preemptible": "on"}) == (
        "preemptible",
        "preemptible must be true or false, not 'on'",
    )
    # a malformed volume list: each door shows its own example
    assert notebook_refusal({"volumes": [7]})[1].endswith("such as 'bucket@store/prefix:/mount:ro'")
    assert job_refusal({"volumes": [7]})[1].endswith("such as 'bucket@store/prefix:/data:ro'")
    image = "evil/" + "x" * 100
    _, nb = notebook_refusal({"image": image})
    _, job = job_refusal({"image": image})
    assert nb.startswith("image 'evil/xxx") and "..." in nb.split(" is not")[0]
    assert job.startswith(f"image {image!r} is not in the catalog")


def test_text_from_the_form_takes_numbers_the_json_door_does_not():
    assert checks.optional_text(FieldError, "version", 3.11, 32, form=True) == "3.11"
    assert job_refusal({"version": 3.11}) == ("version", "version must be a string, not float 3.11")
    assert checks.optional_text(FieldError, "flavor", "", 32) is None


@pytest.mark.parametrize(
    ("raw", "field", "message"),
    [
        # a job's name, label values and git entries ask checks.text / not_text and the bounds'
        # check_chars: the same words as every other text field, the git entries' untyped
        ({"name": 12}, "name", "name must be a string, not int 12"),
        ({"labels": {"k": 1}}, "labels.k", "labels.k must be a string, not int 1"),
        ({"labels": {"k": None}}, "labels.k", "labels.k must be a string, not null None"),
        ({"labels": {"k": "v" * 64}}, "labels.k", "labels.k: at most 63 characters (got 64)"),
        ({"git": [{"url": 42}]}, "git[0].url", "git[0].url must be a string, not 42"),
        (
            {"git": [{"url": "https://example.com/r.git", "branch": ["b"]}]},
            "git[0].branch",
            "git[0].branch must be a string, not ['b']",
        ),
        (
            {"git": [{"url": "https://example.com/" + "r" * 5000}]},
            "git[0].url",
            "git[0].url: at most 2048 characters (got 5020)",
        ),
    ],
)
def test_a_jobs_text_fields_use_the_shared_checks(raw, field, message):
    assert job_refusal(raw) == (field, message)


def test_text_and_its_refusal():
    assert checks.text(FieldError, "k", "", 3) == ""
    assert checks.not_text("k", 1.5) == "k must be a string, not float 1.5"
    assert checks.not_text("k", 1.5, typed=False) == "k must be a string, not 1.5"
    with pytest.raises(FieldError, match=r"^k must be a string, not list \[\]$"):
        checks.optional_text(FieldError, "k", [], 3, form=True, typed=True)


def test_secret_names():
    assert checks.secret_name(FieldError, "env.X", "wandb") == "wandb"
    with pytest.raises(FieldError, match="a secret's name is 1 to 63") as e:
        checks.secret_name(FieldError, "env.X", "Bad Name")
    assert e.value.field == "env.X"


@pytest.mark.parametrize(
    "raw",
    [b'{"command": "\\ud800"}', b'{"env": {"\\udfff": "x"}}', b'{"a": ["\\ud83d"]}'],
)
def test_a_body_with_an_unpaired_surrogate_is_refused(raw):
    """JSON's \\u escapes can write half a surrogate pair, which no UTF-8 encoder takes
    (a 500 where a parser encoded it to count bytes); a pair is one character, and fine."""
    with pytest.raises(FieldError) as e:
        checks.json_object(raw)
    assert e.value.field == "body" and "surrogate" in str(e.value)
    assert checks.json_object(b'{"a": "\\ud83d\\ude00"}') == {"a": "\U0001f600"}


def test_a_body_nested_deep_is_refused_not_a_crash():
    for depth in (900, 5000, 100_000):
        raw = b'{"a": ' + b"[" * depth + b"]" * depth + b"}"
        try:
            checks.json_object(raw)
        except FieldError as e:
            assert e.field == "body"


def test_a_notebooks_labels_are_a_jobs():
    def labels(raw):
        return parse_notebook_options(
            {"labels": raw}, CATALOG, FLAVORS, LIMITS, "cpu-small", storage=STORAGE, user="ann"
        ).labels

    assert labels({"team": "vision", "exp.id": "r2-b"}) == {"team": "vision", "exp.id": "r2-b"}
    assert labels(None) == labels("") == {}
    # the form's text: key=value, by commas or lines
    assert labels("team=vision, exp.id=r2-b\nnote=") == {
        "team": "vision",
        "exp.id": "r2-b",
        "note": "",
    }
    assert notebook_refusal({"labels": "team"}) == (
        "labels",
        "labels: write each label as key=value, not 'team'",
    )
    assert notebook_refusal({"labels": "Team=a"})[0] == "labels.Team"
    assert notebook_refusal({"labels": ",".join(f"k{i}=v" for i in range(65))}) == (
        "labels",
        "labels: at most 64 entries (got 65)",
    )
    # the text is capped before it is split
    assert notebook_refusal({"labels": "a=" + "x" * 9000})[1].startswith(
        "labels: at most 8192 characters"
    )


def test_label_filters():
    assert checks.label_filters(FieldError, ["team=a", "x=b=c", "e="]) == {
        "team": "a",
        "x": "b=c",
        "e": "",
    }
    with pytest.raises(FieldError) as e:
        checks.label_filters(FieldError, ["team"])
    assert (e.value.field, str(e.value)) == ("label", "label filters are key=value")
