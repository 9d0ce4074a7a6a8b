"""The event loop's watch (gpulab/loopwatch.py): a callback that holds the loop past the
threshold is logged with its duration and what it was; the lag sampler sees a held loop."""

from __future__ import annotations

import asyncio
import functools
import logging
import time

import pytest

from gpulab.loopwatch import LoopWatch, lag_loop
from gpulab.settings import GpulabSettings
from tests.conftest import run_async


async def _holds_the_loop() -> None:
    await asyncio.sleep(0)
    time.sleep(0.06)  # the step from the line above to the next await
    await asyncio.sleep(0)


def test_a_slow_step_is_logged_with_its_coroutine_and_lines(caplog):
    caplog.set_level(logging.WARNING, "gpulab.loop")
    original = asyncio.Handle._run

    async def main():
        watch = LoopWatch(0.03).install()
        try:
            await asyncio.create_task(_holds_the_loop())
            await asyncio.sleep(0.01)  # quick steps: not logged
        finally:
            watch.uninstall()
        return watch

    watch = run_async(main())
    # (another step preempted past the threshold on a loaded machine may be logged too)
    assert watch.count >= 1, caplog.text
    took, name = watch.worst
    assert took >= 0.06
    assert "task _holds_the_loop: from _holds_the_loop" in name and "test_loopwatch.py:" in name
    assert "event loop held" in caplog.text
    assert LoopWatch.installed is None and asyncio.Handle._run is original


def _holds(seconds: float, secret: str) -> None:
    time.sleep(seconds)


def test_a_plain_callback_is_named_never_with_its_arguments(caplog):
    """Its function and where it is defined: its arguments (a token, a URL with one, a line
    of a workload's output) never reach the log."""
    caplog.set_level(logging.WARNING, "gpulab.loop")
    token = "0123456789abcdef0123456789abcdef"

    async def main():
        watch = LoopWatch(0.1).install()
        try:
            loop = asyncio.get_running_loop()
            loop.call_soon(_holds, 0.25, token)
            loop.call_soon(functools.partial(_holds, 0.25, secret=f"http://x/?token={token}"))
            await asyncio.sleep(0.6)
        finally:
            watch.uninstall()
        return watch

    watch = run_async(main())
    assert watch.count >= 2, caplog.text
    assert watch.worst[1].startswith("_holds (") and "test_loopwatch.py:" in watch.worst[1]
    assert caplog.text.count("by _holds (") == 2
    assert token[:6] not in caplog.text and token[-6:] not in caplog.text


def test_the_measuring_never_ends_the_loop(monkeypatch):
    """An error of the watch's own (naming a callback) is swallowed: the callback ran, the
    loop goes on."""
    from gpulab import loopwatch

    def broken(*_):
        raise RuntimeError("naming failed")

    monkeypatch.setattr(loopwatch, "describe", broken)
    ran = []

    async def main():
        watch = LoopWatch(0.01).install()
        try:
            asyncio.get_running_loop().call_soon(lambda: (time.sleep(0.05), ran.append(1)))
            await asyncio.sleep(0.1)
            return "the loop went on"
        finally:
            watch.uninstall()

    assert run_async(main()) == "the loop went on" and ran == [1]


def test_the_lag_sampler_sees_a_held_loop():
    lags: list[float] = []

    async def main():
        sampler = asyncio.create_task(lag_loop(0.01, lags.append))
        await asyncio.sleep(0.05)
        time.sleep(0.1)  # the loop held past the sampler's wake-up
        await asyncio.sleep(0.05)
        sampler.cancel()

    run_async(main())
    assert max(lags) >= 0.05
    assert sorted(lags)[len(lags) // 2] < 0.05  # most samples on time


def test_the_setting_refuses_a_negative_threshold():
    from traitlets import TraitError

    with pytest.raises(TraitError, match="event_loop_watch"):
        GpulabSettings(event_loop_watch=-1)
    assert GpulabSettings().event_loop_watch == 0  # off by default


def test_a_long_garbage_collection_is_logged(caplog):
    import gc

    caplog.set_level(logging.WARNING, "gpulab.loop")
    watch = LoopWatch(0.0).install()  # every collection is "long"
    try:
        gc.collect(2)
    finally:
        watch.uninstall()
    assert "garbage collection of generation 2 took" in caplog.text
    assert watch._collected not in gc.callbacks


def test_settling_the_heap_takes_start_ups_objects_out_of_the_collections():
    import gc

    from gpulab.loopwatch import settle_heap

    kept = [[i] for i in range(10_000)]  # made at start-up, kept for good (tracked by gc)
    assert gc.is_tracked(kept[0]) and any(o is kept[0] for o in gc.get_objects())
    try:
        frozen = settle_heap()
        assert frozen >= 10_000 and gc.get_freeze_count() == frozen
        # a collection walks what is tracked outside the permanent generation only
        assert not any(o is kept[0] for o in gc.get_objects())
    finally:
        gc.unfreeze()
