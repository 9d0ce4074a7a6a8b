"""The gpulab CLI's own logic: argument parsing into a submission body, configuration,
output formatting and its errors (no hub needed)."""

from __future__ import annotations

import ast
import http.server
import json
import os
import signal
import stat
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from gpulab import cli
from gpulab.cli.commands import cmd_job_logs
from gpulab.cli.output import job_details, job_table


def parse(*argv: str):
    return cli.build_parser().parse_args(list(argv))


def test_run_builds_the_submission_body():
    args = parse(
        "job", "run", "--name", "train", "--gpu", "2", "--cpu", "4", "--memory", "16G",
        "--framework", "pytorch", "--version", "2.13", "-v", "data@local/mnist:/data:ro",
        "-e", "LR=0.1", "-e", "EMPTY=", "-l", "team=vision", "--timeout", "2h",
        "--retries", "3", "--hang-restart", "30m", "--preemptible", "--priority", "70",
        "--", "python", "train.py", "--epochs", "3", "--",
    )  # fmt: skip
    assert cli.build_submission(args) == {
        "command": ["python", "train.py", "--epochs", "3", "--"],
        "name": "train",
        "framework": "pytorch",
        "version": "2.13",
        "resources": {"gpus": 2, "cpus": 4.0, "memory": "16G"},
        "env": {"LR": "0.1", "EMPTY": ""},
        "labels": {"team": "vision"},
        "volumes": ["data@local/mnist:/data:ro"],
        "timeout": "2h",
        "retries": 3,
        "hang_restart": {"enabled": True, "period": "30m"},
        "preemptible": True,
        "priority": 70,
    }


def test_run_terminate_after_preemption_and_auto_delete_after():
    args = parse("job", "run", "--preemptible", "--terminate-after-preemption", "--", "true")
    body = cli.build_submission(args)
    assert body["preemptible"] is True and body["terminate_after_preemption"] is True
    args = parse("job", "run", "--auto-delete-after", "30d", "--", "true")
    assert cli.build_submission(args)["auto_delete_after"] == "30d"


def test_run_a_job_array(tmp_path, capsys):
    args = parse("job", "run", "--completions", "8", "--parallelism", "2", "--", "true")
    body = cli.build_submission(args)
    assert (body["completions"], body["parallelism"]) == (8, 2)
    sets = tmp_path / "sets.json"
    sets.write_text('[{"lr": 0.1}, {"lr": 0.01, "model": "vit"}]')
    body = cli.build_submission(parse("job", "run", "--parameters", str(sets), "--", "true"))
    assert body["parameters"] == [{"lr": 0.1}, {"lr": 0.01, "model": "vit"}]
    sets.write_text("[{")
    with pytest.raises(cli.CliError, match="is not JSON"):
        cli.build_submission(parse("job", "run", "--parameters", str(sets), "--", "true"))
    with pytest.raises(cli.CliError, match="cannot read"):
        cli.build_submission(parse("job", "run", "--parameters", str(tmp_path / "no"), "--", "x"))
    with pytest.raises(SystemExit):
        parse("job", "run", "--completions", "0", "--", "true")


def test_job_get_of_an_array_lists_its_tasks(capsys):
    array = {
        "id": "ja",
        "name": "sweep",
        "kind": "array",
        "state": "RUNNING",
        "spec": {"resources": {"gpus": 1}, "completions": 2, "parallelism": 1},
        "task_counts": {"RUNNING": 1, "QUEUED": 1},
        "tasks": [
            {"index": 0, "id": "jt0", "state": "RUNNING", "parameters": {"lr": 0.1}},
            {"index": 1, "id": "jt1", "state": "QUEUED", "parameters": {}, "message": "waits"},
        ],
    }
    job_details(array)
    lines = capsys.readouterr().out.splitlines()
    tasks = "Tasks: 2, at most 1 at once: 1 RUNNING, 1 QUEUED (below)"
    assert any(" ".join(line.split()) == tasks for line in lines)
    head = next(i for i, line in enumerate(lines) if line.startswith("INDEX"))
    assert lines[head + 1].split() == ["0", "jt0", "RUNNING", "-", "0", '{"lr":', "0.1}"]
    assert lines[head + 2].split() == ["1", "jt1", "QUEUED", "-", "0", "-", "waits"]
    task = {"id": "jt0", "kind": "task", "array": "ja", "task_index": 0, "state": "RUNNING"}
    job_details({**task, "spec": {"completions": 2, "task": {"parameters": {"lr": 0.1}}}})
    text = capsys.readouterr().out
    assert "ja, task 0 of 2" in text and '{"lr": 0.1}' in text


def test_run_sends_only_what_was_given():
    # a flavor's values are not overridden by CLI defaults; numbers of seconds are numbers
    args = parse("job", "run", "--flavor", "small", "--timeout", "90", "--", "true")
    assert cli.build_submission(args) == {"command": ["true"], "flavor": "small", "timeout": 90}


@pytest.mark.parametrize(
    "argv",
    [
        ("job", "run", "--gpu", "-1", "--", "true"),
        ("job", "run", "--cpu", "0", "--", "true"),
        ("job", "run", "--framework", "a", "--image", "b", "--", "true"),
        ("job", "list", "--all", "--user", "bob"),
        ("job", "get"),
        ("job", "run", "--workers", "0", "--", "true"),
        ("job", "run", "--workers", "65", "--", "true"),
        ("job", "run", "--workers", "two", "--", "true"),
        ("job", "logs", "j1", "--rank", "-1"),
        ("job", "logs", "j1", "--rank", "x"),
        ("-o", "yaml", "usage"),
        ("nope",),
    ],
)
def test_usage_errors_exit_2(argv, capsys):
    assert cli.main(list(argv)) == 2
    assert "gpulab: error:" in capsys.readouterr().err


def test_bad_pairs_and_missing_command_exit_2(capsys, tmp_path, monkeypatch):
    monkeypatch.setenv("GPULAB_URL", "http://127.0.0.1:9")
    monkeypatch.setenv("GPULAB_TOKEN", "t")
    assert cli.main(["job", "run", "-e", "NOEQUALS", "--", "true"]) == 2
    assert "NAME=VALUE" in capsys.readouterr().err
    assert cli.main(["job", "run", "--gpu", "0"]) == 2
    assert "needs a command" in capsys.readouterr().err
    assert cli.main(["job", "get", "../x"]) == 2
    assert cli.main(["job", "get", "J1ABC"]) == 2


def test_output_option_before_or_after_the_command():
    assert parse("-o", "json", "job", "list").output == "json"
    assert parse("job", "list", "-o", "json").output == "json"
    assert not hasattr(parse("job", "list"), "output")  # main() fills in "table"


@pytest.mark.parametrize(
    "given",
    [
        "http://hub:8000",
        "http://hub:8000/",
        "http://hub:8000/hub",
        "http://hub:8000/hub/api/",
        "http://hub:8000/services/gpulab",
        "http://hub:8000/services/gpulab/api",
    ],
)
def test_url_normalised_to_the_hub(given):
    assert cli.normalize_url(given) == "http://hub:8000"


def test_url_needs_a_scheme():
    with pytest.raises(cli.CliError) as e:
        cli.normalize_url("hub:8000")
    assert e.value.code == 2


@pytest.fixture
def clean_env(monkeypatch, tmp_path):
    for name in ("GPULAB_URL", "JUPYTERHUB_URL", "GPULAB_TOKEN", "JUPYTERHUB_API_TOKEN"):
        monkeypatch.delenv(name, raising=False)
    path = tmp_path / "dir" / "config.json"
    monkeypatch.setenv("GPULAB_CONFIG", str(path))
    return path


def test_config_file_is_private_and_env_wins(clean_env, monkeypatch):
    path = cli.write_config("http://hub", "secret")
    assert path == clean_env
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert json.loads(path.read_text()) == {"url": "http://hub", "token": "secret"}
    args = parse("usage")
    assert cli.settings(args) == ("http://hub", "secret")
    monkeypatch.setenv("JUPYTERHUB_API_TOKEN", "from-notebook")
    assert cli.settings(args) == ("http://hub", "from-notebook")
    monkeypatch.setenv("GPULAB_TOKEN", "from-env")
    monkeypatch.setenv("GPULAB_URL", "http://other/hub/")
    assert cli.settings(args) == ("http://other", "from-env")
    assert cli.settings(parse("--url", "http://third", "usage")) == ("http://third", "from-env")
    # rewriting keeps it private
    path.chmod(0o644)
    cli.write_config("http://hub", "new")
    assert stat.S_IMODE(path.stat().st_mode) == 0o600


def test_missing_settings_say_how_to_set_them(clean_env, monkeypatch, capsys):
    assert cli.main(["job", "list"]) == 2
    assert "GPULAB_URL" in capsys.readouterr().err
    monkeypatch.setenv("GPULAB_URL", "http://hub")
    assert cli.main(["job", "list"]) == 2
    err = capsys.readouterr().err
    assert "no API token" in err and "GPULAB_TOKEN" in err and "gpulab login" in err


def test_broken_config_file(clean_env, capsys, monkeypatch):
    clean_env.parent.mkdir()
    clean_env.write_text("{not json")
    assert cli.main(["usage"]) == 2
    assert "cannot read the config file" in capsys.readouterr().err


def test_unreachable_hub(clean_env, monkeypatch, capsys):
    monkeypatch.setenv("GPULAB_URL", "http://127.0.0.1:9")  # discard: nothing listens
    monkeypatch.setenv("GPULAB_TOKEN", "t")
    assert cli.main(["usage"]) == 1
    err = capsys.readouterr().err
    assert "cannot reach gpulab at http://127.0.0.1:9" in err and "refused" in err


def test_table_aligns_columns(capsys):
    cli.table(["ID", "NAME", "STATE"], [["j1", "a-long-name", "DONE"], ["j22", None, "QUEUED"]])
    lines = capsys.readouterr().out.splitlines()
    assert lines[0] == "ID   NAME         STATE"
    assert lines[1] == "j1   a-long-name  DONE"
    assert lines[2] == "j22               QUEUED"


@pytest.mark.parametrize(
    ("seconds", "text"),
    [(0, "0s"), (59, "59s"), (60, "1m"), (61, "1m01s"), (3600, "1h"), (5400, "1h30m"),
     (7 * 86400, "7d"), (90000, "1d1h")],
)  # fmt: skip
def test_durations(seconds, text):
    assert cli.duration(seconds) == text


def test_runtime_of_an_ended_job_comes_from_its_history():
    job = {
        "state": "DONE",
        "running_since": None,
        "history": [
            {"state": "QUEUED", "at": "2026-01-01T00:00:00Z"},
            {"state": "RUNNING", "at": "2026-01-01T00:00:10Z"},
            {"state": "DONE", "at": "2026-01-01T00:02:15Z"},
        ],
    }
    assert cli.runtime(job) == "2m05s"
    assert cli.runtime({"state": "DONE", "running_since": None}) == "-"


@pytest.mark.parametrize(
    ("given", "hub"),
    [("http://hub", "http://hub"), ("https://x.org/lab/hub/", "https://x.org/lab")],
)
def test_url_host_names_and_prefixes(given, hub):
    assert cli.normalize_url(given) == hub


def test_workers_go_to_the_submission_only_when_given():
    args = parse("job", "run", "--workers", "4", "--gpu", "1", "--", "python", "train.py")
    assert cli.build_submission(args) == {
        "command": ["python", "train.py"],
        "resources": {"gpus": 1},
        "workers": 4,
    }
    assert "workers" not in cli.build_submission(parse("job", "run", "--", "true"))
    assert parse("job", "run", "--workers", "64", "--", "true").workers == 64


def test_notify_options_make_the_notify_field():
    args = parse(
        "job", "run", "--notify-webhook", "https://h.example.org/x", "--notify-on",
        "done, failed", "--", "true",
    )  # fmt: skip
    assert cli.build_submission(args)["notify"] == {
        "webhook": "https://h.example.org/x",
        "on": ["done", "failed"],
    }
    args = parse("job", "run", "--notify-email", "ann@example.org", "--", "true")
    assert cli.build_submission(args)["notify"] == {"email": "ann@example.org"}
    assert "notify" not in cli.build_submission(parse("job", "run", "--", "true"))
    with pytest.raises(cli.CliError, match="--notify-on needs"):
        cli.build_submission(parse("job", "run", "--notify-on", "done", "--", "true"))


def test_the_cli_knows_the_apis_worker_limit():
    from gpulab.jobs.spec import MAX_WORKERS

    assert cli.MAX_WORKERS == MAX_WORKERS


def test_an_image_from_a_registry_and_its_pull_options():
    from gpulab import imagerefs
    from gpulab.cli.parser import PULL_POLICIES

    assert PULL_POLICIES == imagerefs.PULL_POLICIES
    args = parse(
        "job",
        "run",
        "--image",
        "ghcr.io/acme/t:1",
        "--image-pull-policy",
        "always",
        "--image-pull-secret",
        "regcred",
        "--",
        "true",
    )
    body = cli.build_submission(args)
    assert (body["image"], body["image_pull_policy"], body["image_pull_secret"]) == (
        "ghcr.io/acme/t:1",
        "always",
        "regcred",
    )
    assert "image_pull_policy" not in cli.build_submission(parse("job", "run", "--", "true"))


def test_workers_help_says_what_a_worker_is(capsys):
    with pytest.raises(SystemExit):
        parse("job", "run", "--help")
    text = " ".join(capsys.readouterr().out.split())
    assert "containers of a distributed job, each with the --gpu/--cpu/--memory given" in text


def test_logs_rank_goes_to_the_api(monkeypatch, capsys):
    calls = []

    class FakeClient:
        url = "http://hub"

        def stream(self, path, params):
            calls.append((path, params))
            yield b"[rank 1] hi\n"

    args = parse("job", "logs", "j1abc", "--rank", "1")
    args.output = "table"
    assert cmd_job_logs(args, FakeClient()) == 0
    assert calls == [("/jobs/j1abc/logs", {"follow": "false", "rank": "1"})]
    calls.clear()
    args = parse("job", "logs", "j1abc")  # default: every rank, as the API merges them
    assert cmd_job_logs(args, FakeClient()) == 0
    assert calls == [("/jobs/j1abc/logs", {"follow": "false"})]


def distributed_job(**extra) -> dict:
    return {
        "id": "j1abc",
        "name": "ddp",
        "state": "RUNNING",
        "spec": {"workers": 2, "resources": {"gpus": 2, "cpus": 1, "memory": "4G"}},
        "devices": ["0", "1", "2", "3"],
        "billed_minutes": 3,
        "billed_gpu_minutes": 12,
        "workers": [
            {"rank": 0, "container": "gl-job-j1abc", "node": "", "devices": ["0", "1"]},
            {"rank": 1, "container": "gl-job-j1abc-r1", "node": "n2", "devices": ["2", "3"]},
        ],
        **extra,
    }


def test_job_list_shows_gpus_in_all_and_per_worker(capsys):
    one = {"id": "j2", "name": "one", "state": "DONE", "spec": {"resources": {"gpus": 1}}}
    job_table([distributed_job(), one])
    lines = capsys.readouterr().out.splitlines()
    gpus = lines[0].index("GPUS")
    assert lines[1][gpus:].startswith("4 (2x2) ")
    assert lines[2][gpus:].split()[0] == "1"


def test_job_get_lists_each_worker(capsys):
    job_details(distributed_job())
    text = capsys.readouterr().out
    lines = text.splitlines()
    assert "Workers:" in text and "2 (a distributed job: ranks below)" in text
    assert "2 GPU, 1 CPU, 4G memory per worker (2 workers: 4 GPU in all)" in text
    assert any(line.split() == ["Billed", "GPU", "minutes:", "12"] for line in lines)
    head = next(
        i
        for i, line in enumerate(lines)
        if line.split() == ["RANK", "CONTAINER", "NODE", "DEVICES"]
    )
    assert lines[head + 1].split() == ["0", "gl-job-j1abc", "-", "0,1"]
    assert lines[head + 2].split() == ["1", "gl-job-j1abc-r1", "n2", "2,3"]
    # a one-container job: no rank table, 1 worker
    job_details({"id": "j2", "spec": {"resources": {"gpus": 1}}, "workers": [{"rank": 0}]})
    text = capsys.readouterr().out
    assert "RANK" not in text
    assert any(line.split() == ["Workers:", "1"] for line in text.splitlines())


def test_following_every_rank_shows_each_line_once(monkeypatch, capsysbinary):
    """The live stream interleaves the ranks as they come; the read after the end (the saved
    log, in time order) interleaves them otherwise: only lines not yet shown are added."""
    from gpulab.cli import commands as cli_commands

    monkeypatch.setattr(cli_commands, "POLL", 0)
    states = iter(["RUNNING", "DONE"])
    reads = iter(
        [
            [b"[rank 1] b\n[ra", b"nk 0] a\n[rank 0] same\n"],
            [b"[rank 0] a\n[rank 0] same\n[rank 1] b\n[rank 0] same\n[rank 1] c"],
        ]
    )
    asked = []

    class FakeClient:
        def json(self, method, path):
            return {"id": "j1", "state": next(states), "spec": {"workers": 2}}

        def stream(self, path, params):
            asked.append(params)
            yield from next(reads)

    job = cli_commands.follow_logs(FakeClient(), "j1")
    assert job["state"] == "DONE"
    assert asked == [{"follow": "true"}, {"follow": "false"}]
    assert capsysbinary.readouterr().out == (
        b"[rank 1] b\n[rank 0] a\n[rank 0] same\n[rank 0] same\n[rank 1] c\n"
    )


def test_exec_and_shell_take_a_rank():
    from gpulab.cli import exec as cli_exec

    asked = []

    class FakeClient:
        url = "https://hub.example/lab"

        def json(self, method, path, **kw):
            asked.append((method, path, kw["params"], kw["json"]))
            return {"exit_code": 0, "output": ""}

    args = parse("job", "exec", "--rank", "1", "j1abc", "--", "hostname")
    args.output = "table"
    assert cli_exec.cmd_job_exec(args, FakeClient()) == 0
    assert asked[-1][:3] == ("POST", "/jobs/j1abc/exec", [("rank", "1")])
    args = parse("job", "exec", "j1abc", "--", "hostname")
    args.output = "table"
    cli_exec.cmd_job_exec(args, FakeClient())
    assert asked[-1][2] == []  # rank 0: the service's default
    assert parse("job", "shell", "--rank", "3", "j1abc").rank == 3
    assert cli_exec._ws_url(FakeClient(), "j1abc", 80, 24, 3) == (
        "wss://hub.example/lab/services/gpulab/api/jobs/j1abc/shell?cols=80&rows=24&rank=3"
    )
    assert "rank" not in cli_exec._ws_url(FakeClient(), "j1abc", 80, 24)
    with pytest.raises(SystemExit):
        parse("job", "shell", "--rank", "64", "j1abc")


# --- the CLI speaks the REST API and nothing else of gpulab -------------------------------------


def _loaded_gpulab_modules(code: str) -> list[str]:
    """The gpulab modules a fresh interpreter has loaded after running ``code``."""
    probe = code + "\nimport sys\nprint(*sorted(m for m in sys.modules if m.startswith('gpulab')))"
    run = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, timeout=60, check=True
    )
    return run.stdout.split()


def _outside_the_cli(modules: list[str]) -> list[str]:
    # "gpulab" itself: the parent package, loaded first; it holds only __version__
    return [
        m
        for m in modules
        if m != "gpulab" and m != "gpulab.cli" and not m.startswith("gpulab.cli.")
    ]


def test_importing_the_cli_loads_nothing_of_gpulab_outside_it():
    modules = _loaded_gpulab_modules("import gpulab.cli")
    assert "gpulab.cli.commands" in modules  # the probe sees the CLI's own modules
    assert _outside_the_cli(modules) == []


def test_running_the_cli_loads_nothing_of_gpulab_outside_it():
    modules = _loaded_gpulab_modules(
        "import contextlib, io\n"
        "from gpulab.cli import main\n"
        "with contextlib.redirect_stdout(io.StringIO()):\n"
        "    assert main(['--help']) == 0 and main(['job', 'run', '--help']) == 0\n"
    )
    assert "gpulab.cli.parser" in modules
    assert _outside_the_cli(modules) == []


def test_no_cli_module_imports_gpulab_outside_the_cli():
    """Every import in src/gpulab/cli/, those inside functions too, stays in the package."""
    package = Path(cli.__file__).parent
    found = []
    for path in sorted(package.glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom):
                if node.level > 1:  # from .. import x: out of the package
                    found.append((path.name, node.lineno, "." * node.level + (node.module or "")))
                    continue
                names = [] if node.level else [node.module or ""]
            else:
                continue
            for name in names:
                if (name == "gpulab" or name.startswith("gpulab.")) and not (
                    name == "gpulab.cli" or name.startswith("gpulab.cli.")
                ):
                    found.append((path.name, node.lineno, name))
    assert len(list(package.glob("*.py"))) >= 7  # the walk saw the package's modules
    assert found == []


# --- Ctrl-C while following ---------------------------------------------------------------------


class _StalledService(http.server.BaseHTTPRequestHandler):
    """A gpulab service whose job RUNS and whose log stream, once asked for, sends its headers
    and then nothing (a job quiet for hours, or a stalled proxy)."""

    protocol_version = "HTTP/1.1"
    asked_logs: threading.Event
    release: threading.Event

    def log_message(self, *args) -> None:
        pass

    def _json(self, code: int, body: dict) -> None:
        data = json.dumps(body).encode()
        self.send_response(code)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def do_POST(self) -> None:  # noqa: N802 (http.server's name)
        self.rfile.read(int(self.headers["Content-Length"]))
        self._json(201, {"id": "j1abc", "name": "sleeper", "state": "QUEUED"})

    def do_GET(self) -> None:  # noqa: N802
        if self.path.startswith("/services/gpulab/api/jobs/j1abc/logs"):
            self.send_response(200)
            self.send_header("Content-Type", "text/plain")
            self.send_header("Transfer-Encoding", "chunked")
            self.end_headers()
            self.wfile.flush()
            self.asked_logs.set()
            self.release.wait(60)
        else:
            self._json(200, {"id": "j1abc", "name": "sleeper", "state": "RUNNING", "spec": {}})


@pytest.fixture
def stalled_service():
    handler = type(
        "Handler",
        (_StalledService,),
        {"asked_logs": threading.Event(), "release": threading.Event()},
    )
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    server.daemon_threads = True
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_port}", handler
    finally:
        handler.release.set()
        server.shutdown()
        server.server_close()


#: starts the CLI (same process, exec) with SIGINT as a non-interactive shell leaves it for a
#: command it runs in the background (`gpulab job run --follow ... &` in a script, a CI job):
#: ignored, a disposition that exec keeps
_IGNORING_SIGINT = (
    "import os, signal, sys; signal.signal(signal.SIGINT, signal.SIG_IGN); "
    "os.execv(sys.executable, [sys.executable, '-m', 'gpulab.cli', *sys.argv[1:]])"
)


@pytest.mark.parametrize("inherited", ["default", "ignored"])
def test_ctrl_c_stops_following_a_silent_stream_at_once(stalled_service, tmp_path, inherited):
    """Ctrl-C during `job run --follow` on a log stream that sends nothing: the prompt is back
    within a few seconds (exit 130, the job left running), whatever SIGINT disposition the CLI
    inherited. It once hung in CI: Python installs its KeyboardInterrupt handler only where
    SIGINT was not ignored at start-up, and the CLI, run by a pytest that had inherited SIGINT
    ignored, sat in the stream's read."""
    url, service = stalled_service
    env = {
        **{k: v for k, v in os.environ.items() if not k.startswith(("GPULAB_", "JUPYTERHUB_"))},
        "GPULAB_URL": url,
        "GPULAB_TOKEN": "t0ken",
        "GPULAB_CONFIG": str(tmp_path / "none.json"),
    }
    start = ["-c", _IGNORING_SIGINT] if inherited == "ignored" else ["-m", "gpulab.cli"]
    proc = subprocess.Popen(
        [sys.executable, *start, "job", "run", "--gpu", "0", "--follow", "--", "sleep", "600"],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert service.asked_logs.wait(30), "the CLI never asked for the log stream"
        time.sleep(0.2)  # into the stream's read
        sent = time.monotonic()
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=5)
        took = time.monotonic() - sent
    finally:
        proc.kill()
        proc.wait()
    assert proc.returncode == 130, err
    assert took < 5
    assert out == ""
    assert "stopped following job j1abc, which keeps running" in err


def test_the_fair_share_as_text():
    from gpulab.cli.commands import fair_share_lines

    fs = {
        "gpu_hours": 3.2,
        "used": 0.4,
        "share": 0.25,
        "factor": 0.33,
        "group": {"name": "ml", "gpu_hours": 10.1, "used": 0.6, "share": 0.5, "factor": 0.44},
        "half_life_hours": 168.0,
        "queued": [
            {"id": "J1", "place": 3},
            {"notebook": "big", "place": 4},
            {"id": "J2", "place": 6},
        ],
        "queued_mine": 3,
        "queued_total": 7,
    }
    assert fair_share_lines(fs) == [
        "",
        "fair share (half-life 168.0 h): 3.2 recent GPU-hours, 40% of everyone's for a share "
        "of 25%: factor 0.33",
        "group ml: 10.1 recent GPU-hours, 60% of everyone's for a share of 50%: factor 0.44",
        "in line: 3 of yours among 7 waiting (place: J1 3, notebook big 4, J2 6)",
    ]
    assert fair_share_lines({**fs, "group": None, "queued": []})[2:] == []
    assert fair_share_lines(None) == []  # an older service


# --- notebooks ----------------------------------------------------------------------------------


def test_notebook_start_sends_the_forms_options_given():
    from gpulab.cli.notebooks import user_options

    args = parse(
        "notebook", "start", "train", "--framework", "pytorch", "--version", "2.3",
        "--editor", "vscode", "--flavor", "gpu-1", "--gpu", "0.5", "--cpu", "2",
        "--memory", "8G", "--gpu-model", "A100", "--node-pool", "lab",
        "-v", "data@s3/ds:/data:ro", "-v", "out@s3:/out:rw", "-l", "team=vision",
        "-l", "exp=r2", "--auto-restart", "--notify-email", "me@example.org",
        "--notify-on", "failed", "--wait",
    )  # fmt: skip
    assert args.server == "train" and args.wait
    assert user_options(args) == {
        "framework": "pytorch",
        "version": "2.3",
        "editor": "vscode",
        "flavor": "gpu-1",
        "gpus": "0.5",  # the spawner reads numbers and fractions alike
        "cpus": 2.0,
        "memory": "8G",
        "gpu_model": "A100",
        "node_pool": "lab",
        "volumes": ["data@s3/ds:/data:ro", "out@s3:/out:rw"],
        "labels": {"team": "vision", "exp": "r2"},
        "auto_restart": True,
        "notify_email": "me@example.org",
        "notify_on": ["failed"],
    }
    # nothing given: None, so that the hub starts it again with the options it had
    bare = parse("notebook", "start")
    assert bare.server == "" and user_options(bare) is None


@pytest.mark.parametrize(
    "argv",
    [
        ["notebook", "start", "-l", "team"],
        ["notebook", "start", "--notify-on", "done"],
        ["notebook", "start", "a/b"],
        ["notebook", "logs", "nb", "--tail", "0"],
        ["notebook", "logs", "nb", "--tail", "10001"],
        ["notebook", "list", "-l", "nokey"],
    ],
)
def test_notebook_usage_errors_exit_2(argv, capsys, monkeypatch):
    monkeypatch.setenv("GPULAB_URL", "http://127.0.0.1:9")
    monkeypatch.setenv("GPULAB_TOKEN", "t")
    monkeypatch.setattr(cli.Client, "whoami", lambda self: "ann")
    assert cli.main(argv) == 2
    assert "gpulab: error:" in capsys.readouterr().err


def test_notebook_paths_on_the_hub_and_in_gpulab():
    from gpulab.cli.notebooks import hub_server_path, notebook_path, notebook_url

    assert hub_server_path("ann", "") == "/users/ann/server"
    assert hub_server_path("a@b.org", "run 1") == "/users/a%40b.org/servers/run%201"
    assert notebook_path("ann", "") == "/notebooks/ann/"
    assert notebook_path("ann", "nb") == "/notebooks/ann/nb"
    assert notebook_url("https://hub/lab", "ann", "nb") == "https://hub/lab/user/ann/nb/"
    assert notebook_url("https://hub/lab", "ann", "") == "https://hub/lab/user/ann/"
    # the hub's own path (its base URL included) on the hub's scheme and host
    assert notebook_url("https://hub/lab", "ann", "nb", "/lab/user/ann/nb/") == (
        "https://hub/lab/user/ann/nb/"
    )


class FakeHub:
    """A Client whose hub and gpulab answers are scripted."""

    url = "http://hub"

    def __init__(self, events=(), records=()):
        self.events, self.records, self.calls = list(events), list(records), []

    def whoami(self):
        return "ann"

    def request(self, method, path, **kw):
        self.calls.append((method, path, kw))

        class R:
            status_code = 202
            content = b"[I] started\n"

        return R()

    def hub_events(self, path):
        self.calls.append(("EVENTS", path, {}))
        yield from self.events

    def json(self, method, path, **kw):
        self.calls.append((method, path, kw))
        return self.records.pop(0)


def test_notebook_start_wait_follows_the_progress_then_prints_the_url(capsys):
    from gpulab.cli.notebooks import cmd_notebook_start

    hub = FakeHub(
        events=[
            {"progress": 10, "message": "reserving resources"},
            {"progress": 10, "message": "reserving resources"},
            {"progress": 50, "message": "pulling the workspace"},
            {"progress": 100, "ready": True, "url": "/user/ann/nb/"},
        ]
    )
    args = parse("notebook", "start", "nb", "-l", "team=a", "--wait")
    args.output = "table"
    assert cmd_notebook_start(args, hub) == 0
    method, path, kw = hub.calls[0]
    assert (method, path) == ("POST", "/users/ann/servers/nb")
    assert kw["hub"] is True and kw["json"] == {"user_options": {"labels": {"team": "a"}}}
    assert hub.calls[1][:2] == ("EVENTS", "/users/ann/servers/nb/progress")
    captured = capsys.readouterr()
    assert captured.out == "http://hub/user/ann/nb/\n"
    assert "[ 10%] reserving resources\n[ 50%] pulling the workspace\n" in captured.err
    assert captured.err.count("reserving") == 1


def test_notebook_start_that_fails_says_the_hubs_reason(capsys):
    from gpulab.cli.notebooks import cmd_notebook_start

    hub = FakeHub(events=[{"progress": 100, "failed": True, "message": "Spawn failed: no GPU"}])
    args = parse("notebook", "start", "--wait")
    args.output = "table"
    with pytest.raises(cli.CliError, match="ann's default notebook did not start: Spawn failed"):
        cmd_notebook_start(args, hub)
    assert hub.calls[0][:2] == ("POST", "/users/ann/server")
    assert hub.calls[0][2]["json"] is None  # its options as they were


def test_notebook_stop_wait_polls_until_it_ended(monkeypatch, capsys):
    from gpulab.cli import notebooks

    monkeypatch.setattr(notebooks, "POLL", 0)
    hub = FakeHub(
        records=[
            {"server": "nb", "state": "STOPPING"},
            {"server": "nb", "state": "SYNC_FAILED", "history": [{"message": "store down"}]},
        ]
    )
    args = parse("notebook", "stop", "nb", "--wait")
    args.output = "table"
    assert notebooks.cmd_notebook_stop(args, hub) == 1  # not STOPPED
    assert hub.calls[0][:2] == ("DELETE", "/users/ann/servers/nb")
    assert capsys.readouterr().out == "notebook nb: SYNC_FAILED: store down\n"


def test_notebook_list_shows_labels_and_filters_on_them(capsys):
    from gpulab.cli.notebooks import cmd_notebook_list

    hub = FakeHub(
        records=[
            {
                "notebooks": [
                    {
                        "user": "ann",
                        "server": "nb",
                        "state": "RUNNING",
                        "options": {
                            "framework": "python",
                            "version": "3.11",
                            "gpus": 0,
                            "labels": {"team": "a", "exp": "r2"},
                        },
                    },
                    {"user": "ann", "server": "", "state": "STOPPED", "options": {}},
                ],
                "total": 2,
            }
        ]
    )
    args = parse("notebook", "list", "-l", "team=a")
    args.output = "table"
    assert cmd_notebook_list(args, hub) == 0
    assert ("label", "team=a") in hub.calls[0][2]["params"]
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].split()[-1] == "LABELS"
    assert lines[1].split()[:3] == ["ann", "nb", "RUNNING"]
    assert lines[1].split()[-1] == "team=a,exp=r2"
    assert lines[2].split()[-1] == "-"


def test_notebook_logs_reads_the_tail(capsysbinary):
    from gpulab.cli.notebooks import cmd_notebook_logs

    hub = FakeHub()
    args = parse("notebook", "logs", "nb", "-n", "50")
    assert cmd_notebook_logs(args, hub) == 0
    assert hub.calls == [("GET", "/notebooks/ann/nb/logs", {"params": {"tail": "50"}})]
    assert capsysbinary.readouterr().out == b"[I] started\n"
    hub = FakeHub()
    assert cmd_notebook_logs(parse("notebook", "logs", "--user", "bob"), hub) == 0
    assert hub.calls == [("GET", "/notebooks/bob//logs", {"params": {}})]


def test_snapshot_commands_speak_the_users_snapshots(capsys):
    from gpulab.cli.snapshots import (
        cmd_snapshot_create,
        cmd_snapshot_delete,
        cmd_snapshot_list,
        cmd_snapshot_restore,
    )

    answers = [
        {"name": "v1", "objects": 3, "bytes": 2048, "new_bytes": 1024},
        {
            "snapshots": [
                {
                    "name": "v1",
                    "created": "2026-11-27T10:00:00Z",
                    "source": {"kind": "notebook", "notebook": "nb"},
                    "objects": 3,
                    "bytes": 2048,
                }
            ],
            "stored_bytes": 2048,
            "quota_bytes": None,
        },
        {"name": "v1", "notebook": "", "copied": 2, "deleted": 1, "unchanged": 1},
        {"name": "v1", "deleted": True, "freed_bytes": 0},
    ]
    hub = FakeHub(records=answers)
    for argv, func in (
        (["create", "v1", "--notebook", "nb"], cmd_snapshot_create),
        (["list"], cmd_snapshot_list),
        (["restore", "v1"], cmd_snapshot_restore),
        (["delete", "v1", "--user", "bob"], cmd_snapshot_delete),
    ):
        args = parse("snapshot", *argv)
        args.output = "table"
        assert func(args, hub) == 0
    assert [c[:2] for c in hub.calls] == [
        ("POST", "/snapshots/ann"),
        ("GET", "/snapshots/ann"),
        ("POST", "/snapshots/ann/v1/restore"),
        ("DELETE", "/snapshots/bob/v1"),
    ]
    assert hub.calls[0][2]["json"] == {"name": "v1", "notebook": "nb"}
    assert hub.calls[2][2]["json"] == {"notebook": ""}
    lines = capsys.readouterr().out.splitlines()
    assert lines[0] == "snapshot v1: 3 files, 2.0K (1.0K new)"
    assert lines[1].split() == ["NAME", "CREATED", "OF", "FILES", "SIZE"]
    assert lines[2].split()[0] == "v1" and lines[2].split()[-4:] == ["notebook", "nb", "3", "2.0K"]
    assert lines[4] == "stored: 2.0K of unlimited (shared files counted once)"
    assert lines[5] == (
        "snapshot v1 restored into notebook (default): 2 files copied, 1 deleted, 1 unchanged"
    )
    assert lines[6] == "snapshot v1 deleted (0 freed)"


def test_snapshot_of_a_jobs_volume(capsys, monkeypatch):
    from gpulab.cli.snapshots import cmd_snapshot_create

    hub = FakeHub(records=[{"name": "r1", "objects": 1, "bytes": 10, "new_bytes": 10}])
    args = parse("snapshot", "create", "r1", "--job", "j1abc", "--volume", "/out")
    args.output = "table"
    assert cmd_snapshot_create(args, hub) == 0
    assert hub.calls[0][2]["json"] == {"name": "r1", "job": "j1abc", "volume": "/out"}
    monkeypatch.setenv("GPULAB_URL", "http://127.0.0.1:9")
    monkeypatch.setenv("GPULAB_TOKEN", "t")
    monkeypatch.setattr(cli.Client, "whoami", lambda self: "ann")
    assert cli.main(["snapshot", "create", "r1", "--job", "j1abc"]) == 2
    assert "--job and --volume go together" in capsys.readouterr().err
    assert cli.main(["snapshot", "create", "r1", "--job", "j1", "--notebook", "nb"]) == 2


def test_lists_follow_the_services_next_pages_whatever_its_base_url(capsys):
    """`gpulab job list` and `gpulab usage --month` read each next page the service names
    (its cursor and filters, never an offset of their own: a job that ended or went between
    two pages neither skips a row nor repeats one); only the query of `next` is read, so a
    hub behind a base URL works; the total and the month are the first page's."""
    from gpulab.cli import commands as cli_commands

    pages = {
        "": {
            "jobs": [{"id": "j3"}, {"id": "j2"}],
            "total": 3,
            "next": "/lab/services/gpulab/api/jobs?state=DONE&limit=500&cursor=abc",
        },
        "abc": {"jobs": [{"id": "j1"}], "total": 1, "next": None},
    }
    asked = []

    class FakeClient:
        def json(self, method, path, **kw):
            params = dict(kw["params"])
            asked.append((path, params))
            if path == "/jobs":
                return pages[params.get("cursor", "")]
            after = params.get("after")
            if after is None:
                return {
                    "month": "2026-11",
                    "users": [{"user": "ann"}],
                    "next": "/services/gpulab/api/usage/report?month=2026-11&after=ann&limit=500",
                }
            return {"month": "2026-12", "users": [{"user": "bob"}], "next": None}

    data = cli_commands._all_pages(FakeClient(), "/jobs", [("state", "DONE")], "jobs")
    assert [j["id"] for j in data["jobs"]] == ["j3", "j2", "j1"] and data["total"] == 3
    assert asked == [
        ("/jobs", {"state": "DONE", "limit": "500"}),
        ("/jobs", {"state": "DONE", "limit": "500", "cursor": "abc"}),
    ]
    args = parse("usage", "--month", "now")
    args.output = "json"
    asked.clear()
    assert cli_commands._month_report(args, FakeClient(), []) == 0
    assert asked[1] == ("/usage/report", {"month": "2026-11", "after": "ann", "limit": "500"})
    assert json.loads(capsys.readouterr().out) == {
        "month": "2026-11",  # the first page's: a page read after midnight is of it still
        "users": [{"user": "ann"}, {"user": "bob"}],
    }
