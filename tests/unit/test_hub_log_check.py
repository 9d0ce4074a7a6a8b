"""The check that a test run's hub and service logs hold no unexpected traceback."""

from __future__ import annotations

from ..support.hub import log_problems

LOG = """\
[I 2026-11-25 16:38:44.081 JupyterHub app:3944] JupyterHub is now running at http://127.0.0.1:1
[E 2026-11-25 16:38:45.000 JupyterHub web:1875] Uncaught exception DELETE /hub/api/users/a/servers/x
    Traceback (most recent call last):
      File "/x/tornado/web.py", line 1790, in _execute
        result = await result
    TypeError: object NoneType can't be used in 'await' expression
[I 2026-11-25 16:38:46.000 JupyterHub log:192] 204 DELETE /hub/api/users/a/servers/x
[E 2026-11-25 16:38:47.000 JupyterHub user:884] Unhandled error starting a's server: boom
[W 2026-11-25 16:38:48.000 gpulab.service] a warning, no traceback
Traceback (most recent call last):
  File "<string>", line 1, in <module>
RuntimeError: provoked on purpose
"""


def test_a_clean_log_has_no_problems():
    assert log_problems("[I 2026 JupyterHub] all fine\n[W 2026 gpulab] slow\n") == []


def test_each_traceback_comes_with_its_record_and_its_last_line():
    problems = log_problems(LOG, allowed=[])
    assert len(problems) == 3
    first, second, third = problems
    assert first.startswith("[E 2026-11-25 16:38:45.000 JupyterHub web:1875] Uncaught exception")
    assert first.endswith("TypeError: object NoneType can't be used in 'await' expression")
    assert "204 DELETE" not in first
    assert second.startswith("[E") and "Unhandled error starting" in second
    assert "a warning" not in second
    assert third.endswith("RuntimeError: provoked on purpose")


def test_an_allowed_traceback_is_not_a_problem():
    allowed = [(r"RuntimeError: provoked on purpose", "the test provokes it")]
    problems = log_problems(LOG, allowed=allowed)
    assert len(problems) == 2
    assert not any("provoked on purpose" in p for p in problems)


RACE = """\
[E 2026-11-26 14:04:03.212 JupyterHub ioloop:945] Exception in callback <bound method JupyterHub.check_services_health of <jupyterhub.app.JupyterHub object at 0x7f>>
    Traceback (most recent call last):
      File "/x/jupyterhub/app.py", line 3015, in check_services_health
        await Server.from_orm(service.orm.server).wait_up(
      File "/x/jupyterhub/objects.py", line 144, in _orm_server_changed
        self.proto = obj.proto
    AttributeError: 'NoneType' object has no attribute 'proto'
"""
SHUTDOWN = "[C 2026-11-26 14:04:02.913 JupyterHub app:4035] Received signal SIGTERM, initiating shutdown...\n"
RUNNING = "[I 2026-11-26 14:05:00.000 JupyterHub app:3944] JupyterHub is now running at http://x\n"


def test_jupyterhubs_shutdown_race_is_excused_only_while_it_shuts_down():
    assert len(log_problems(RACE)) == 1  # while running: a problem
    assert log_problems(SHUTDOWN + RACE) == []  # in its shutdown: JupyterHub's race
    assert len(log_problems(SHUTDOWN + RUNNING + RACE)) == 1  # started again: a problem
