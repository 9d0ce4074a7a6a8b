"""The sync's exclusion list and push cap, as data: which paths a pattern covers, and what a
push and a (mirror) pull with it leave alone, on the filesystem store."""

from __future__ import annotations

import pytest

from gpulab.datasync.cli import main as sync_main
from gpulab.datasync.engine import pull, push
from gpulab.datasync.exclude import ExcludeError, Excludes, check_patterns
from gpulab.datasync.filesystem import FilesystemRemote
from gpulab.storage import DEFAULT_HOME_EXCLUDE

HOME = Excludes(DEFAULT_HOME_EXCLUDE)


@pytest.mark.parametrize(
    ("rel", "excluded"),
    [
        (".cache/pip/http/1/2/x", True),
        (".cache", False),  # a file named .cache at the root: the pattern names a directory
        ("proj/.cache/x", True),  # one name: at any depth
        ("proj/.local/share/Trash/x", False),  # a path: anchored at the root
        ("proj/pkg/__pycache__/m.cpython-311.pyc", True),
        ("__pycache__/m.pyc", True),
        (".npm/_cacache/index-v5/aa", True),
        (".npm/_logs/1.log", False),
        (".local/share/Trash/files/old.txt", True),
        (".local/share/code-server/logs/20260101/x.log", True),
        (".local/share/code-server/CachedData/abc/x", True),
        (".local/share/code-server/coder-logs/code-server-stdout.log", True),
        (".local/share/code-server/extensions/me.ext-1.0.0/package.json", False),
        (".local/share/code-server/User/settings.json", False),
        (".local/share/jupyter/runtime/jpserver-7.json", True),
        (".local/lib/python3.11/site-packages/hello/__init__.py", False),
        (".local/bin/hello", False),
        (
            ".jupyter/lab/user-settings/@jupyterlab/apputils-extension/themes.jupyterlab-settings",
            False,
        ),
        (".bashrc", False),
        (".bash_history", False),
        ("envs/venv/lib/python3.11/site-packages/x/__pycache__/a.pyc", True),
        ("mini/pkgs/cache/1.json", False),
        (".conda/pkgs/numpy-1.0/info/x", True),
    ],
)
def test_default_home_exclusions(rel, excluded):
    assert HOME.excludes(rel) is excluded


@pytest.mark.parametrize(
    ("patterns", "rel", "excluded"),
    [
        (["*.log"], "a/b/c.log", True),
        (["*.log"], "a/b.log/c", True),  # a directory named *.log excludes what is below it
        (["*.log/"], "a/b.log", False),  # directories only
        (["build/**/tmp/"], "build/tmp/x", True),  # ** matches no directory too
        (["build/**/tmp/"], "build/a/b/tmp/x", True),
        (["build/**/tmp/"], "src/build/tmp/x", False),
        (["a/b"], "a/b", True),
        (["a/b"], "a/b/c", True),
        (["a/b"], "x/a/b", False),
        (["A"], "a", False),  # case-sensitive
        ([], "anything", False),
    ],
)
def test_exclusion_rules(patterns, rel, excluded):
    assert Excludes(patterns).excludes(rel) is excluded


@pytest.mark.parametrize("bad", ["", "  ", "/abs", "a//b", "a/../b", "./a", "a\nb", "x" * 201])
def test_bad_patterns_are_refused_naming_them(bad):
    with pytest.raises(ExcludeError, match="exclude pattern"):
        check_patterns([bad])


def test_too_many_patterns():
    with pytest.raises(ExcludeError, match="more than 100"):
        Excludes(["a"] * 101)


def _tree(root, files: dict[str, bytes]) -> None:
    for rel, data in files.items():
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(data)


def _keys(remote: FilesystemRemote, prefix: str) -> set[str]:
    return {o.key for o in remote.list(prefix)}


def test_push_and_mirror_pull_leave_excluded_paths_alone(tmp_path):
    store, home, other = tmp_path / "store", tmp_path / "home", tmp_path / "other"
    remote = FilesystemRemote(str(store), "b")
    _tree(
        home,
        {
            ".bashrc": b"alias ll='ls -l'\n",
            ".cache/pip/wheel.whl": b"w" * 100,
            "pkg/__pycache__/m.pyc": b"pyc",
            "pkg/m.py": b"x = 1\n",
        },
    )
    report = push(home, remote, "h", "rwd", exclude=HOME)
    assert report.ok and report.completed == 2
    assert _keys(remote, "h/") == {"h/.bashrc", "h/pkg/m.py"}

    # an object stored before its path was excluded stays in the store, and is not pulled
    pushed_before = tmp_path / "before"
    _tree(pushed_before, {".cache/old": b"old"})
    assert push(pushed_before, remote, "h/", "rw").ok
    assert "h/.cache/old" in _keys(remote, "h/")
    report = pull(remote, other, "h", delete=True, exclude=HOME)
    assert report.ok and not (other / ".cache").exists()
    assert (other / "pkg/m.py").read_bytes() == b"x = 1\n"

    # a mirror pull never deletes an excluded local file, even one the manifest knew
    _tree(other, {".cache/local": b"mine"})
    assert pull(remote, other, "h", delete=True).ok  # without the list: .cache/old comes
    assert remote.delete_many(["h/.cache/old"]) == []
    assert pull(remote, other, "h", delete=True, exclude=HOME).ok
    assert (other / ".cache/old").read_bytes() == b"old"
    assert (other / ".cache/local").read_bytes() == b"mine"

    # rwd: deleting an excluded local file never deletes its object either
    push(other, remote, "h2", "rwd")  # .cache/old now synced under h2 (no list)
    (other / ".cache/old").unlink()
    report = push(other, remote, "h2", "rwd", exclude=HOME)
    assert report.ok and "h2/.cache/old" in _keys(remote, "h2/")


def test_push_over_its_cap_sends_and_deletes_nothing(tmp_path):
    store, home = tmp_path / "store", tmp_path / "home"
    remote = FilesystemRemote(str(store), "b")
    _tree(home, {"a": b"a" * 600, "gone": b"g"})
    assert push(home, remote, "h", "rwd").ok
    (home / "gone").unlink()
    _tree(home, {"b": b"b" * 600, ".cache/big": b"c" * 5000})
    report = push(home, remote, "h", "rwd", max_bytes=1000, exclude=HOME)
    assert not report.ok and report.completed == 0 and report.deleted == 0
    (failure,) = report.failures
    assert failure.key == "" and "(--max-bytes)" in failure.reason
    assert "1.2 KiB in 2 files, more than its cap of 1000 B" in failure.reason
    assert _keys(remote, "h/") == {"h/a", "h/gone"}  # nothing sent, nothing deleted
    assert (home / "b").exists()  # nothing local touched
    # the excluded cache does not count: within the cap once b goes
    (home / "b").unlink()
    report = push(home, remote, "h", "rwd", max_bytes=1000, exclude=HOME)
    assert report.ok and report.deleted == 1 and _keys(remote, "h/") == {"h/a"}


def test_cli_takes_exclusions_and_refuses_a_bad_one(tmp_path, capsys):
    home = tmp_path / "home"
    _tree(home, {"keep": b"k", "skip.log": b"s"})
    endpoint = f"file://{tmp_path / 'store'}"
    args = ["push", "--bucket", "bkt", "--prefix", "p", "--local", str(home), "--mode", "rwd"]
    assert sync_main([*args, "--store-endpoint", endpoint, "--exclude", "*.log"]) == 0
    remote = FilesystemRemote(str(tmp_path / "store"), "bkt")
    assert _keys(remote, "p/") == {"p/keep"}
    assert sync_main([*args, "--store-endpoint", endpoint, "--exclude", "../x"]) == 2
    assert "exclude pattern '../x'" in capsys.readouterr().err
