"""Headless Chromium (Debian's, driven by Playwright) against a real hub.

Chromium missing skips these tests on a developer machine but FAILS in CI (CI=true). Never run
`playwright install`: it downloads another browser; `make browser` installs Debian's.
"""

from __future__ import annotations

import contextlib
import re
import time
from pathlib import Path

import pytest

from ..conftest import IN_CI, _need, wait_until  # noqa: F401 (the browser tests import it here)
from ..support.docshots import keep_for_docs

CHROMIUM = Path("/usr/bin/chromium")
CHROMIUM_ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]
SCREENSHOTS = Path(__file__).resolve().parents[2] / "artifacts" / "screenshots"

HUB_CONFIG = """
c.GpulabSettings.gpu_devices = [{"id": "0", "model": "Test GPU", "memory": "16G"}, {"id": "1", "model": "Test GPU", "memory": "16G"}]
c.GpulabSettings.gpu_mode = "env"
# GPU 1 is shareable in halves (test_gpu_share.py); jobs and whole GPUs take GPU 0 first
c.GpulabSettings.gpu_sharing = {"1": 2}
from gpulab.settings import DEFAULT_FLAVORS
c.GpulabSettings.flavors = [
    *DEFAULT_FLAVORS,
    {"id": "gpu-half", "title": "Half a GPU, 1 CPU, 2 GiB", "cpus": 1, "memory": "2G", "gpus": 0.5},
]
c.GpulabSettings.supervisor_interval = 0.2
c.GpulabSettings.job_container_retention = 3600
"""


@pytest.fixture(scope="session")
def playwright():
    """Playwright's driver, one per session (a second one cannot start beside it)."""
    if not CHROMIUM.exists():
        _need(f"{CHROMIUM} is missing; run `make browser` (Debian's chromium)")
    try:
        from playwright.sync_api import sync_playwright
    except ImportError:
        _need("the playwright package is missing; run `make venv`")
    pw = sync_playwright().start()
    yield pw
    pw.stop()


def launch(playwright, *extra_args: str):
    """Debian's Chromium, headless, with the tests' arguments and ``extra_args``."""
    return playwright.chromium.launch(
        executable_path=str(CHROMIUM), args=[*CHROMIUM_ARGS, *extra_args]
    )


@pytest.fixture(scope="session")
def browser(playwright):
    b = launch(playwright)
    yield b
    b.close()


@pytest.fixture(scope="module")
def hub(hub_with):
    return hub_with(HUB_CONFIG)


def passwords(hub) -> dict[str, str]:
    text = (hub.workdir / "data" / "passwords.txt").read_text()
    return dict(line.split("=", 1) for line in text.split())


class Shots:
    """Screenshots of a test's pages, numbered in order: artifacts/screenshots/<test>-NN-<what>.png;
    the docs' pictures among them also go to docs/img with GPULAB_DOC_SHOTS=1
    (tests/support/docshots.py)."""

    def __init__(self, test: str):
        self.test = re.sub(r"[^A-Za-z0-9_-]+", "_", test)
        self.n = 0
        SCREENSHOTS.mkdir(parents=True, exist_ok=True)
        for old in SCREENSHOTS.glob(f"{self.test}-*.png"):
            old.unlink()

    def __call__(self, page, what: str) -> Path:
        self.n += 1
        path = SCREENSHOTS / f"{self.test}-{self.n:02d}-{what}.png"
        page.screenshot(path=str(path), full_page=True)
        keep_for_docs(self.test, what, path)  # the docs' pictures (GPULAB_DOC_SHOTS=1)
        return path


@pytest.fixture
def shots(request):
    return Shots(request.node.name)


def pages_of(browser, shots, request):
    """Yield ``make()``: a page in a fresh context of ``browser`` (its own cookies); after the
    test, every context is closed, a failing test's pages shot first (for ``yield from`` in a
    fixture)."""
    contexts = []

    def make():
        ctx = browser.new_context(viewport={"width": 1280, "height": 900})
        ctx.set_default_timeout(30_000)
        contexts.append(ctx)
        page = ctx.new_page()
        page.goto = reloading_on_network_change(page.goto)
        # what Chromium could not load, for lab_ready's check (net::ERR_NETWORK_CHANGED, ...)
        page.failed_loads = []
        page.on("requestfailed", lambda r, p=page: p.failed_loads.append((r.url, r.failure)))
        return page

    yield make
    failed = getattr(request.node, "rep_call", None)
    for i, ctx in enumerate(contexts):
        if failed is not None and failed.failed:
            for page in ctx.pages:
                with contextlib.suppress(Exception):
                    shots(page, f"failure-{i}")
        ctx.close()


@pytest.fixture
def new_page(browser, shots, request):
    """A fresh browser context (its own cookies) per user; a failing test keeps a last shot."""
    yield from pages_of(browser, shots, request)


def reloading_on_network_change(goto):
    """``page.goto`` that loads once more, as a person would, when Chromium aborts the load with
    ERR_NETWORK_CHANGED: it does so whenever this host's network interfaces change, and the
    other tests' containers (and the swarm lab's nodes) add bridges and veths all the time."""

    def go(url, **kwargs):
        try:
            return goto(url, **kwargs)
        except Exception as e:  # playwright's Error
            if "ERR_NETWORK_CHANGED" not in str(e):
                raise
            time.sleep(0.5)
            return goto(url, **kwargs)

    return go


def lab_ready(page, timeout: float = 90_000) -> None:
    """JupyterLab's shell and launcher drawn. A load Chromium aborted on a network change
    (ERR_NETWORK_CHANGED, as for reloading_on_network_change) while the lab loaded (a theme's
    stylesheet: "Error Loading Theme" then covers the page) loads the page once more, as a
    person would; any other failed load is left for the test to meet."""
    for attempt in (1, 2):
        page.wait_for_selector(".jp-LabShell", timeout=timeout)
        page.locator(".jp-LauncherCard").first.wait_for(timeout=timeout)
        aborted = [u for u, why in page.failed_loads if "ERR_NETWORK_CHANGED" in (why or "")]
        if not aborted or attempt == 2:
            return
        page.failed_loads.clear()
        time.sleep(0.5)
        page.reload()


@pytest.hookimpl(hookwrapper=True, tryfirst=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    rep = outcome.get_result()
    setattr(item, "rep_" + rep.when, rep)


def login(page, hub, user: str, admin: bool = False, base: str | None = None) -> None:
    """Log in through the hub's own login page with the shared (or admin) password, at the
    hub's URL or at ``base`` (a front door's)."""
    pw = passwords(hub)["admin" if admin else "user"]
    page.goto(f"{base or hub.url}/hub/login")
    page.fill("#username_input", user)
    page.fill("#password_input", pw)
    page.click("#login_submit")
    page.wait_for_url(re.compile(r".*/hub/(home|spawn|spawn-pending|user/).*|.*/user/.*"))


#: VS Code's workbench, once code-server drew it
WORKBENCH = ".monaco-workbench"


def spawn_vscode_from_form(page, hub, user: str, server: str, base: str | None = None) -> None:
    """Start ``server`` with VS Code from the spawn form (at the hub's URL or ``base``) and
    wait until its workbench shows /workspace (the remote side, a websocket, is up)."""
    page.goto(f"{base or hub.url}/hub/spawn/{user}/{server}")
    page.wait_for_selector("#gpulab-framework")
    page.select_option("#gpulab-framework", "python")
    page.select_option("#gpulab-editor", "vscode")
    page.select_option("#gpulab-flavor", "cpu-small")
    page.click("#spawn_form button[type=submit]")
    page.wait_for_url(re.compile(rf".*/user/{user}/{server}/vscode/.*"), timeout=180_000)
    page.wait_for_selector(WORKBENCH, timeout=120_000)
    # the explorer shows /workspace once the remote side (a websocket) is up
    page.wait_for_selector(".explorer-folders-view", timeout=60_000)


def run_command(page, title: str, timeout_s: float = 90) -> None:
    """Run a VS Code command through the command palette, by its title.

    The palette can open before the workbench has registered every command (the remote side
    contributes some once its websocket is up), so a palette that does not list the command
    is closed and opened again until ``timeout_s``."""
    from playwright.sync_api import TimeoutError as PlaywrightTimeoutError

    deadline = time.monotonic() + timeout_s
    # the row of that very command (a search also lists commands whose titles merely contain it)
    row = page.locator(f'.quick-input-list .monaco-list-row[aria-label^="{title}"]').first
    while True:
        page.keyboard.press("F1")
        box = page.locator(".quick-input-widget input")
        box.wait_for()
        box.fill(">" + title)
        try:
            row.wait_for(timeout=10_000)
        except PlaywrightTimeoutError:
            if time.monotonic() > deadline:
                raise
            page.keyboard.press("Escape")
            time.sleep(1)
            continue
        row.click()
        return
