"""The JupyterHub that is starting in this process, for code its configuration file calls.

The hub's configuration file runs in the hub's process (from ``JupyterHub.load_config_file``,
while the event loop already runs) and in the gpulab service's (which reads the same file for
its settings, with no hub). Hooks that must act once the hub has read all its configuration
ask :func:`starting_hub` and schedule themselves on its loop.
"""

from __future__ import annotations

import asyncio
import sys


def starting_hub():
    """(the JupyterHub application, its running event loop) when this process is a hub that is
    starting; None elsewhere (the service reading the same file, a test, a script)."""
    app = sys.modules.get("jupyterhub.app")
    if app is None or not app.JupyterHub.initialized():
        return None
    try:
        loop = asyncio.get_running_loop()
    except RuntimeError:  # no event loop: the hub is not starting
        return None
    return app.JupyterHub.instance(), loop
