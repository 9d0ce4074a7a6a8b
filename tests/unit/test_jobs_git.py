"""A job's git sources without an engine: the ``git`` field's rules and its JSON Schema, the
clone helper's container config, the credential's way in and its absence from messages."""

from __future__ import annotations

import pytest

from gpulab.bounds import MAX_GIT_REF_CHARS, MAX_GIT_SOURCES, MAX_GIT_URL_CHARS
from gpulab.datasync import gitclone
from gpulab.jobs.spec import GitSource, JobSpecError
from gpulab.jobs.spec.git import check_git_mounts, default_path, parse_git
from gpulab.jobs.spec.schema import GIT_SCHEMA
from gpulab.jobs.supervisor.git_sources import (
    HELPER_DEST,
    TOKEN_USER,
    clone_helper_spec,
    credential_files,
    git_mounts,
    git_volume_names,
    git_volume_prefix,
)
from gpulab.runtime.base import Mount
from gpulab.runtime.objects import helper_container_config

URL = "https://git.example.org/org/repo.git"
SECRETS = frozenset({"gitlab", "gh-token"})


def parse(value, secrets=SECRETS):
    return parse_git(value, secrets)


def refused(value, field: str, words: str, secrets=SECRETS) -> str:
    with pytest.raises(JobSpecError) as e:
        parse(value, secrets)
    assert e.value.field == field, (e.value.field, str(e.value))
    assert words in str(e.value), str(e.value)
    return str(e.value)


# --- the field ---------------------------------------------------------------------------------


def test_absent_and_defaults():
    assert parse(None) == () and parse([]) == ()
    (src,) = parse([{"url": URL}])
    assert src == GitSource(URL, "/workspace/repo")
    assert src.ref_text == "the default branch"
    (src,) = parse([{"url": "https://h/x/tool", "branch": "main", "path": "/src/tool"}])
    assert (src.path, src.branch, src.revision, src.ref_text) == (
        "/src/tool",
        "main",
        None,
        "branch main",
    )
    # null and "" are absent (a body returned by the API, submitted again)
    (src,) = parse([{"url": URL, "branch": None, "revision": "", "path": None, "secret": None}])
    assert src == GitSource(URL, "/workspace/repo")


def test_round_trip_through_json():
    given = parse(
        [
            {"url": URL, "revision": "v1.2", "secret": "gitlab"},
            {"url": "http://h:8080/a/b.git", "branch": "feature/x", "path": "/data/b"},
        ]
    )
    stored = [g.to_json() for g in given]
    assert stored[0] == {
        "url": URL,
        "branch": None,
        "revision": "v1.2",
        "path": "/workspace/repo",
        "secret": "gitlab",
    }
    assert tuple(GitSource.from_json(d) for d in stored) == given
    assert parse(stored) == given  # what the API returns is a valid submission


def test_default_path_from_the_url():
    assert default_path("https://h/org/repo.git") == "/workspace/repo"
    assert default_path("https://h/org/repo/") == "/workspace/repo"
    assert default_path("https://h/my.lib") == "/workspace/my.lib"
    for url in ("https://h/", "https://h", "https://h/org/my%20repo.git", "https://h/.git"):
        assert default_path(url) is None, url
    refused([{"url": "https://h/"}], "git[0].path", "is required")


@pytest.mark.parametrize(
    "url, words",
    [
        ("git@github.com:org/repo.git", "https:// (or http://) URL"),
        ("ssh://git@h/org/repo.git", "https:// (or http://) URL"),
        ("git://h/org/repo.git", "https:// (or http://) URL"),
        ("file:///etc/repo", "https:// (or http://) URL"),
        ("/srv/git/repo.git", "https:// (or http://) URL"),
        ("https://user:pw@h/org/repo.git", 'give its name in "secret"'),
        ("https://token@h/org/repo.git", "must not contain a user name or password"),
        ("https:///org/repo.git", "has no host"),
        ("https://h:99999/r.git", "not a valid URL"),
        ("https://h/r.git?x=1", "query"),
        ("https://h/r.git#main", "fragment"),
        ("https://h/r .git", "spaces or control characters"),
        ("https://h/r.git\n", "spaces or control characters"),
    ],
)
def test_bad_urls(url, words):
    message = refused([{"url": url, "path": "/workspace/r"}], "git[0].url", words)
    if "pw@" in url:
        assert "pw" not in message.replace("password", "")  # not echoed back


def test_url_required_and_typed():
    refused([{"branch": "main"}], "git[0].url", "required")
    refused([{"url": 42}], "git[0].url", "must be a string")
    refused([{"url": "https://h/" + "a" * MAX_GIT_URL_CHARS}], "git[0].url", "at most")


@pytest.mark.parametrize(
    "name",
    ["main", "feature/x-1", "v1.2.3", "release_2024", "a" * 40, "refs/pull/12/head", "ümlaut"],
)
def test_good_refs(name):
    assert parse([{"url": URL, "branch": name}])[0].branch == name
    assert parse([{"url": URL, "revision": name}])[0].revision == name


@pytest.mark.parametrize(
    "name",
    [
        "-rf",
        "--upload-pack=evil",
        "/main",
        "main/",
        "a..b",
        "a b",
        "a~1",
        "a^",
        "a:b",
        "a?",
        "a*",
        "a[",
        "a\\b",
        "x.lock",
        "x.lock/y",
        "a/.hidden",
        ".hidden",
        "a.",
        "a//b",
        "@",
        "a@{1}",
        "a\x7fb",
        "a\tb",
    ],
)
def test_bad_refs(name):
    refused([{"url": URL, "branch": name}], "git[0].branch", "valid git branch name")
    refused([{"url": URL, "revision": name}], "git[0].revision", "valid git tag, commit or ref")


def test_branch_or_revision_not_both():
    refused([{"url": URL, "branch": "a", "revision": "b"}], "git[0].revision", "not both")
    refused([{"url": URL, "branch": "a" * (MAX_GIT_REF_CHARS + 1)}], "git[0].branch", "at most")
    refused([{"url": URL, "branch": 1}], "git[0].branch", "must be a string")


@pytest.mark.parametrize(
    "path, words",
    [
        ("workspace/repo", "absolute, normalized"),
        ("/workspace/../etc", "absolute, normalized"),
        ("/workspace/./repo", "absolute, normalized"),
        ("/workspace/repo/", "absolute, normalized"),
        ("/workspace//repo", "absolute, normalized"),
        ("//workspace", "root directory"),
        ("/", "root directory"),
        ("/etc", "system directory /etc"),
        ("/usr/local/src", "system directory /usr"),
        ("/proc/self", "system directory /proc"),
        ("/lib64/x", "system directory /lib64"),
        ("/opt/gpulab", "system directory /opt/gpulab"),
        ("/opt/gpulab/run.sh", "system directory /opt/gpulab"),
    ],
)
def test_bad_paths(path, words):
    refused([{"url": URL, "path": path}], "git[0].path", words)


def test_good_paths():
    for path in ("/workspace/repo", "/src", "/opt/code", "/usr2/x", "/etcetera", "/home/jovyan/r"):
        assert parse([{"url": URL, "path": path}])[0].path == path


def test_paths_unique_and_not_nested():
    refused([{"url": URL}, {"url": URL}], "git[1].path", "the same as git[0].path")
    refused(
        [{"url": URL, "path": "/w/a"}, {"url": URL, "path": "/w/a/b"}],
        "git[1].path",
        "nested with git[0].path",
    )
    refused(
        [{"url": URL, "path": "/w/a/b"}, {"url": URL, "path": "/w/a"}],
        "git[1].path",
        "nested with",
    )
    two = parse([{"url": URL, "path": "/w/a"}, {"url": URL, "path": "/w/ab"}])
    assert [g.path for g in two] == ["/w/a", "/w/ab"]


def test_caps_and_shapes():
    many = [{"url": URL, "path": f"/w/{i}"} for i in range(MAX_GIT_SOURCES)]
    assert len(parse(many)) == MAX_GIT_SOURCES
    refused(many + [{"url": URL, "path": "/w/x"}], "git", f"at most {MAX_GIT_SOURCES}")
    refused({"url": URL}, "git", "must be a list")
    refused(["https://h/r.git"], "git[0]", "must be a list")
    refused([{"url": URL, "depth": 1}], "git[0].depth", "a git entry takes: url, branch")


def test_secrets():
    assert parse([{"url": URL, "secret": "gitlab"}])[0].secret == "gitlab"
    refused([{"url": URL, "secret": "nope"}], "git[0].secret", "gpulab secret set nope")
    refused([{"url": URL, "secret": "gitlab"}], "git[0].secret", "not enabled", secrets=None)
    refused([{"url": URL, "secret": "Bad Name"}], "git[0].secret", "secret's name")
    refused([{"url": URL, "secret": 7}], "git[0].secret", "secret's name")
    # without a secret, secrets need not be enabled
    assert parse([{"url": URL}], secrets=None)[0].secret is None


def test_against_volume_mounts():
    sources = parse([{"url": URL}])
    check_git_mounts(sources, ["/data", "/workspace"])  # inside a volume: fine
    with pytest.raises(JobSpecError) as e:
        check_git_mounts(sources, ["/workspace/repo"])
    assert e.value.field == "git[0].path"


# --- the schema agrees with the parser -----------------------------------------------------------

EXAMPLES = [
    [],
    None,
    [{"url": URL}],
    [{"url": URL, "branch": "main", "path": "/src/repo", "secret": "gitlab"}],
    [{"url": "HTTP://h:8080/r", "revision": "0123abcd", "path": "/w/r"}],
    [{"url": URL, "branch": None, "revision": "v1", "path": None, "secret": None}],
    [{"url": URL, "branch": "", "revision": "v1"}],
    [{"url": "ftp://h/r.git", "path": "/w/r"}],
    [{"url": "https://u:p@h/r.git", "path": "/w/r"}],
    [{"url": "https://h/r.git?x", "path": "/w/r"}],
    [{"url": URL, "branch": "a", "revision": "b"}],
    [{"url": URL, "branch": "-x"}],
    [{"url": URL, "branch": "a..b"}],
    [{"url": URL, "revision": "x.lock"}],
    [{"url": URL, "revision": "a/"}],
    [{"url": URL, "path": "/etc/x"}],
    [{"url": URL, "path": "/opt/gpulab"}],
    [{"url": URL, "path": "rel"}],
    [{"url": URL, "path": "/a/../b"}],
    [{"url": URL, "path": "/"}],
    [{"url": URL, "secret": "Bad"}],
    [{"url": URL, "extra": 1}],
    [{"branch": "main"}],
    [{"url": URL, "path": f"/w/{i}"} for i in range(MAX_GIT_SOURCES + 1)],
    # without a path, the URL's last part names the directory: it must be able to
    [{"url": "https://h/org/repo.git/"}],
    [{"url": "https://h:8080/a/b_c-1.d//"}],
    [{"url": "https://h/org/x.git.git", "path": None}],
    [{"url": "https://h/org/.git"}],
    [{"url": "https://h/org/-x"}],
    [{"url": "https://h/org/r%20x"}],
    [{"url": "https://h"}],
    [{"url": "https://h/"}],
    [{"url": "https://h/org/r%20x", "path": ""}],
    [{"url": "https://h/org/r%20x", "path": "/src/x"}],
    # a bracketed host is an IPv6 address as ipaddress reads it; no white space anywhere (the
    # parser's str.isspace()); no host character that NFKC turns into a separator (urlsplit)
    [{"url": "https://[::1]:8080/r"}],
    [{"url": "https://[fe80::1:2:3:4:5:6]/r"}],
    [{"url": "https://[::ffff:1.2.3.4]/r"}],
    [{"url": "https://[::ffff:01.2.3.4]/r"}],
    [{"url": "https://[1.2.3.4]/r"}],
    [{"url": "https://[12345::]/r"}],
    [{"url": "https://[1:2:3:4:5:6:7:8:9]/r"}],
    [{"url": "https://[abcdefg]/r"}],
    [{"url": "https://h\u00a0x/r"}],
    [{"url": "https://h/r\u2028x"}],
    [{"url": "https://h\u2100x/r"}],
    [{"url": "https://h\uff20x/r"}],
    [{"url": "https://h\u00e9/r"}],
]


@pytest.mark.parametrize("value", EXAMPLES)
def test_schema_and_parser_agree(value):
    jsonschema = pytest.importorskip("jsonschema")
    jsonschema.Draft202012Validator.check_schema(GIT_SCHEMA)
    by_schema = jsonschema.Draft202012Validator(GIT_SCHEMA).is_valid(value)
    try:
        parse(value)
        by_parser = True
    except JobSpecError:
        by_parser = False
    assert by_schema == by_parser, (value, by_schema, by_parser)


# --- volumes, mounts, the helper --------------------------------------------------------------


def test_volumes_and_mounts():
    sources = parse([{"url": URL}, {"url": URL, "path": "/src/b"}])
    assert git_volume_names("gl-job-7", sources) == ["gl-job-7-git-0", "gl-job-7-git-1"]
    assert all(
        v.startswith(git_volume_prefix("gl-job-7")) for v in git_volume_names("gl-job-7", sources)
    )
    assert git_mounts("gl-job-7", sources) == [
        Mount("gl-job-7-git-0", "/workspace/repo", read_only=False),
        Mount("gl-job-7-git-1", "/src/b", read_only=False),
    ]


def test_credentials():
    assert credential_files("glpat-abc\n") == {
        "git-username": TOKEN_USER.encode(),
        "git-password": b"glpat-abc",
    }
    assert credential_files("alice:pa:ss") == {
        "git-username": b"alice",
        "git-password": b"pa:ss",
    }
    # a lone colon is no user:password pair: the whole value is the token
    assert credential_files(":tok")["git-password"] == b":tok"
    with pytest.raises(ValueError):
        credential_files("  \n")


def test_helper_config_carries_the_credential_in_its_secret_files_only():
    (src,) = parse([{"url": URL, "revision": "v1", "secret": "gitlab"}])
    spec = clone_helper_spec(
        image="gpulab/sync:1",
        source=src,
        volume="gl-job-7-git-0",
        labels={"org.gpulab.kind": "sync-helper"},
        files=credential_files("alice:hunter2"),
    )
    config = helper_container_config(spec)
    # the files are copied into the created helper (runtime.objects.helper_files_archive):
    # nothing an inspection of the helper shows holds the credential
    assert spec.files == {"git-username": b"alice", "git-password": b"hunter2"}
    assert config["environment"] == {"NVIDIA_VISIBLE_DEVICES": "void"}  # and no GPU
    assert "hunter2" not in repr(config) and "alice" not in repr(config)
    assert config["command"] == [
        "git-clone",
        f"--url={URL}",
        f"--dest={HELPER_DEST}",
        "--replace",
        f"--timeout={gitclone.DEFAULT_TIMEOUT:g}",
        f"--max-bytes={gitclone.DEFAULT_MAX_BYTES}",
        "--revision=v1",
    ]
    host = config["host_config"]
    # its own volume and nothing else; not root, no capabilities, not the host's network
    assert host["binds"] == {"gl-job-7-git-0": {"bind": HELPER_DEST, "mode": "rw"}}
    assert config["user"] == "1000:100"
    assert host["cap_drop"] == ["ALL"] and host["privileged"] is False
    assert host["network_mode"] == "bridge"
    assert config["labels"]["org.gpulab.kind"] == "sync-helper"
    assert config["labels"]["org.gpulab.helper"] == "git-clone"


def test_messages_are_scrubbed():
    secrets = gitclone._auth_forms("alice", "hunter2")
    text = "GET https://alice:hunter2@h/r.git failed: Authorization: Basic " + secrets[1]
    clean = gitclone.scrub(text, secrets)
    assert "hunter2" not in clean and secrets[1] not in clean
    assert "https://h/r.git" in clean
    assert gitclone.scrub("see http://tok@h/x", []) == "see http://h/x"


def test_revision_choice():
    main, dev, tag, peeled = (c * 40 for c in "abcd")
    refs = {
        b"HEAD": main.encode(),
        b"refs/heads/main": main.encode(),
        b"refs/heads/dev": dev.encode(),
        b"refs/tags/v1": tag.encode(),
        b"refs/tags/v1^{}": peeled.encode(),
    }
    symrefs = {b"HEAD": b"refs/heads/main"}
    pick = gitclone._pick
    assert pick(refs, symrefs, None, None) == (
        b"refs/heads/main",
        main.encode(),
        None,
        "branch main",
    )
    assert pick(refs, symrefs, "dev", None)[:2] == (b"refs/heads/dev", dev.encode())
    assert pick(refs, symrefs, None, "v1")[:2] == (b"refs/tags/v1", tag.encode())
    assert pick(refs, symrefs, None, "dev")[:2] == (b"refs/heads/dev", dev.encode())
    assert pick(refs, symrefs, None, "refs/tags/v1")[:2] == (b"refs/tags/v1", tag.encode())
    assert pick(refs, symrefs, None, "E" * 40)[:3] == (None, b"e" * 40, None)
    assert pick(refs, symrefs, None, "abcdef1")[:3] == (None, None, "abcdef1")
    for branch, revision, words in (
        ("nope", None, "branch 'nope' not found (branches: dev, main)"),
        (None, "nope", "revision 'nope' not found"),
    ):
        with pytest.raises(
            gitclone.CloneFailed, match=words.replace("(", r"\(").replace(")", r"\)")
        ):
            pick(refs, symrefs, branch, revision)
    with pytest.raises(gitclone.CloneFailed, match="empty"):
        pick({}, {}, None, None)
