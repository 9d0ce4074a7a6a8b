"""A notebook's notices: when it stops or fails, tell its owner as its options ask
(``notify_webhook``, ``notify_email``, ``notify_on``; :mod:`gpulab.notices`).

The hub's :class:`~gpulab.notebooks.records.NotebookRecords` call an :class:`Announcer` after
every committed transition (the one place: the notebook's life, its push retry and the
reconciler all go through ``NotebookRecords.transition``), from whatever thread made it; the
announcer builds the notice and hands it to the hub process's
:class:`~gpulab.notifier.Notifier` on its event loop, which sends it in the background. A
notebook's life never waits for a notice nor fails because of one.
"""

from __future__ import annotations

import asyncio
import logging

from ..notices import Notify, notebook_event, notebook_notice
from ..notifier import Notifier

log = logging.getLogger("gpulab.notebooks")

#: the hub process's notifiers, one per gpulab instance (every spawner shares it)
_notifiers: dict[str, Notifier] = {}


class Announcer:
    """``NotebookRecords.observer``: a transition's record in, a notice out (when asked)."""

    def __init__(self, settings, notifier: Notifier, loop: asyncio.AbstractEventLoop):
        self.settings, self.notifier, self.loop = settings, notifier, loop

    def __call__(self, nb: dict) -> None:
        notify = Notify.from_json((nb.get("options") or {}).get("notify"))
        event = notebook_event(str(nb.get("state")))
        if notify is None or not notify.wants(event):
            return
        s = self.settings
        url = f"{(s.public_url or s.bind_url).rstrip('/')}/hub/home"
        notice = notebook_notice(nb, str(event), url)
        self.loop.call_soon_threadsafe(self.notifier.post, notice, notify)


def announcer_for(settings) -> Announcer | None:
    """The hub process's announcer for ``settings``' instance, on the running loop; None
    outside one (nothing to send notices with)."""
    try:
        loop = asyncio.get_running_loop()
    except RuntimeError:
        return None
    key = settings.instance
    if key not in _notifiers:
        _notifiers[key] = Notifier.from_settings(settings)
    return Announcer(settings, _notifiers[key], loop)
