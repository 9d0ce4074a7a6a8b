"""gpulab's notebook activity: a kernel that runs a cell counts as activity.

jupyterhub-singleuser reports jupyter_server's ``last_activity()`` to the hub every
JUPYTERHUB_ACTIVITY_INTERVAL seconds, and gpulab stops GPU notebooks whose reported activity is
older than their flavor's idle time. jupyter_server moves that time when a kernel sends a
message, not while it computes in silence: a training cell that runs for an hour without
printing would look idle. This server extension keeps the setting ``gpulab_busy_last_activity``
at "now" while any kernel's execution_state is ``busy`` (jupyter_server counts every setting
whose name ends in ``_last_activity``), so a running cell keeps its notebook alive.

Installed into the notebook images by images/python/Dockerfile and enabled in the image's
jupyter_server_config.json; no network call, no configuration.
"""

from __future__ import annotations

from datetime import UTC, datetime

from tornado.ioloop import PeriodicCallback

#: the setting jupyter_server's last_activity() reads (its name must end in _last_activity)
SETTING = "gpulab_busy_last_activity"
#: how often busy kernels are looked at (ms): well below any report interval
INTERVAL_MS = 5_000


def _jupyter_server_extension_points():
    return [{"module": "gpulab_activity"}]


def busy_kernels(kernel_manager) -> list[str]:
    """Ids of the kernels whose last status was busy (a cell or a comm message runs)."""
    out = []
    for kernel_id in list(kernel_manager.list_kernel_ids()):
        try:
            kernel = kernel_manager.get_kernel(kernel_id)
        except KeyError:  # shut down meanwhile
            continue
        if getattr(kernel, "execution_state", None) == "busy":
            out.append(kernel_id)
    return out


def _load_jupyter_server_extension(serverapp) -> None:
    settings = serverapp.web_app.settings
    kernel_manager = serverapp.kernel_manager

    def tick() -> None:
        if busy_kernels(kernel_manager):
            settings[SETTING] = datetime.now(UTC)

    callback = PeriodicCallback(tick, INTERVAL_MS)
    callback.start()
    settings["gpulab_activity_callback"] = callback
    serverapp.log.info("gpulab: busy kernels count as activity (checked every %d ms)", INTERVAL_MS)
