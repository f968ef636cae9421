"""The what-if explorer in a real browser: `streamlit run app.py` headless on a free loopback port,
driven by Playwright on Debian's chromium. Skipped, saying why, where chromium or playwright is missing."""

from __future__ import annotations

import contextlib
import io
import json
import re
import shutil
import site
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

from planner.cli.main import main as cli_main

pytest.importorskip("streamlit", reason="streamlit is not installed (the app extra)")
sync_api = pytest.importorskip("playwright.sync_api", reason="playwright is not installed (pip install playwright)")

APP = Path(__file__).resolve().parents[2] / "app.py"
CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"
# What was seen working headless as root in a container (chromium's own flags; see docs/app.md).
CHROMIUM_ARGS = ["--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run", "--disable-background-networking",
                 "--disable-component-update", "--disable-sync", "--disable-dev-shm-usage"]
START_TIMEOUT_S = 60

pytestmark = pytest.mark.skipif(not Path(CHROMIUM).is_file(),
                                reason="no chromium (Debian: apt-get install chromium; .ci/run installs it)")


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def healthy(url: str) -> bool:
    try:
        with urllib.request.urlopen(f"{url}/_stcore/health", timeout=2) as r:
            return r.read().strip() == b"ok"
    except OSError:
        return False


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    """The app served headless on 127.0.0.1:<free port>, one server for the module's tests (each
    test opens its own browser: a new page is a new Streamlit session, with its own state); always
    stopped, whatever the tests did. Starting one costs 3-6 s of the two cores a test shares."""
    tmp_path = tmp_path_factory.mktemp("server")
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    log_path = tmp_path / "streamlit.log"
    cmd = [sys.executable, "-m", "streamlit", "run", str(APP), "--server.headless", "true",
           "--server.address", "127.0.0.1", "--server.port", str(port), "--browser.gatherUsageStats", "false",
           "--server.fileWatcherType", "none"]
    with open(log_path, "w") as log:
        proc = subprocess.Popen(cmd, cwd=tmp_path, stdout=log, stderr=subprocess.STDOUT)
        try:
            deadline = time.monotonic() + START_TIMEOUT_S
            while not healthy(url):
                if proc.poll() is not None or time.monotonic() > deadline:
                    pytest.fail(f"streamlit did not start (exit {proc.poll()}):\n{log_path.read_text()[-3000:]}")
                time.sleep(0.2)
            yield url
        finally:
            proc.terminate()
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()


def expected_days(gpus: int) -> str:
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        assert cli_main(["estimate", "--params", "33B", "--gpus", str(gpus), "--format", "json"]) == 0
    return f"{json.loads(out.getvalue())['train']['days']:.1f} days"  # by hand (under 100 days: one decimal)


def test_change_gpus_in_a_real_browser(server, tmp_path):
    before, after = expected_days(128), expected_days(256)
    assert before != after
    with sync_api.sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        try:
            page = browser.new_page(viewport={"width": 1500, "height": 1100})
            page.goto(server)
            days = (page.locator('[data-testid="stMetric"]').filter(has_text="time to train")
                    .locator('[data-testid="stMetricValue"]'))
            sync_api.expect(days).to_have_text(before, timeout=30_000)
            gpus = page.get_by_label("GPUs", exact=True)
            gpus.fill("256")
            gpus.press("Enter")
            sync_api.expect(days).to_have_text(after, timeout=30_000)
            sync_api.expect(page).to_have_url(f"{server}/?gpus=256", timeout=10_000)  # the state is in the URL
            page.screenshot(path=tmp_path / "explorer.png", full_page=True)
        finally:
            browser.close()
    assert (tmp_path / "explorer.png").stat().st_size > 10_000


@pytest.fixture(scope="session")
def installed_venv(tmp_path_factory) -> Path:
    """A fresh venv with the project installed by `pip install .` (not editable), built once per
    session. Its dependencies come from this interpreter's site-packages (--system-site-packages),
    so it needs no network; the build backend comes from pip's isolated build as usual."""
    root = tmp_path_factory.mktemp("venv")
    venv = root / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--system-site-packages", str(venv)], check=True, timeout=300)
    # Where this interpreter is itself a venv, --system-site-packages reaches the base Python's
    # packages, not this venv's: name this interpreter's site-packages too (plain path lines, so its
    # editable-install hook is not run and the installed copy is the one imported).
    own = subprocess.run([str(venv / "bin" / "python"), "-c", "import site; print(site.getsitepackages()[0])"],
                         capture_output=True, text=True, check=True, timeout=60).stdout.strip()
    Path(own, "_parent_site.pth").write_text("\n".join(site.getsitepackages()) + "\n")
    result = subprocess.run([str(venv / "bin" / "python"), "-m", "pip", "install", "-q", "--no-deps",
                             str(APP.parent)], cwd=root, capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-2000:]
    return venv


@pytest.mark.slow
def test_planner_app_serves_the_explorer_after_a_plain_install(installed_venv, tmp_path):
    """After `pip install .`, `planner app` (no --headless, no terminal) serves the packaged page:
    it never stops at Streamlit's first-run e-mail prompt, and the page renders the plan."""
    python = installed_venv / "bin" / "python"
    where = subprocess.run([str(python), "-c", "import planner.app.page, planner; print(planner.__file__)"],
                           cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert where.returncode == 0, where.stderr[-2000:]
    assert where.stdout.strip().startswith(str(installed_venv)), where.stdout  # the installed copy, not the tree
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    log_path = tmp_path / "app.log"
    with open(log_path, "w") as log:
        proc = subprocess.Popen([str(installed_venv / "bin" / "planner"), "app", "--port", str(port),
                                 "--address", "127.0.0.1"], cwd=tmp_path, stdin=subprocess.DEVNULL, stdout=log,
                                stderr=subprocess.STDOUT)
        try:
            deadline = time.monotonic() + START_TIMEOUT_S
            while not healthy(url):
                if proc.poll() is not None or time.monotonic() > deadline:
                    pytest.fail(f"planner app did not serve (exit {proc.poll()}):\n{log_path.read_text()[-3000:]}")
                time.sleep(0.2)
            with sync_api.sync_playwright() as pw:
                browser = pw.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
                try:
                    page = browser.new_page()
                    page.goto(url)
                    days = (page.locator('[data-testid="stMetric"]').filter(has_text="time to train")
                            .locator('[data-testid="stMetricValue"]'))
                    want = expected_days(128)
                    try:
                        sync_api.expect(days).to_have_text(want, timeout=60_000)
                    except AssertionError:
                        # Once (seen in one CI run of many, on a loaded machine): the first page of a fresh
                        # install never showed its metrics. Load it again as a user would; a page that
                        # still does not render fails, with what the page and the app said.
                        page.reload()
                        try:
                            sync_api.expect(days).to_have_text(want, timeout=60_000)
                        except AssertionError:
                            pytest.fail(f"the page did not render the plan; page text:\n"
                                        f"{page.inner_text('body')[-2000:]}\napp log:\n{log_path.read_text()[-3000:]}")
                finally:
                    browser.close()
        finally:
            proc.terminate()
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
    assert "email" not in log_path.read_text().lower()


# --- issue 11: the first hour of a new user, in a real browser ---------------------------------------
def _metric(page, label: str):
    return page.locator('[data-testid="stMetric"]').filter(has_text=label).locator('[data-testid="stMetricValue"]')


@pytest.fixture
def browser_page(server):
    with sync_api.sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        try:
            yield browser.new_page(viewport={"width": 1500, "height": 1100}), server
        finally:
            browser.close()


def test_v100_renders_a_plan_with_the_timeline(browser_page):
    page, server = browser_page
    page.goto(f"{server}/?gpu=v100-32g")
    sync_api.expect(_metric(page, "time to train")).to_contain_text("days", timeout=60_000)
    sync_api.expect(page.get_by_text("fp16 (the v100-32g has no bf16", exact=False)).to_be_visible()
    # the pipeline schedule picture is drawn in the Plan tab: a chart whose lanes are the ranks
    sync_api.expect(page.get_by_role("heading", name="Pipeline schedule", exact=False)).to_be_visible(timeout=30_000)
    chart = page.get_by_role("img").filter(has_text=re.compile(r"rank 0.*forward\s*backward"))
    sync_api.expect(chart).to_be_visible(timeout=30_000)


def test_an_out_of_range_input_shows_a_message(browser_page):
    page, server = browser_page
    page.goto(server)
    sync_api.expect(_metric(page, "time to train")).to_contain_text("days", timeout=60_000)
    gpus = page.get_by_label("GPUs", exact=True)
    gpus.fill("0")
    gpus.press("Enter")
    sync_api.expect(page.get_by_text("Out of range: GPUs: 0", exact=False)).to_be_visible(timeout=30_000)
    sync_api.expect(_metric(page, "time to train")).to_have_count(0)  # no stale plan beside the message


def test_a_layouts_row_click_pins_it_and_the_url_restores_it(browser_page):
    page, server = browser_page
    page.goto(server)
    sync_api.expect(_metric(page, "time to train")).to_contain_text("days", timeout=60_000)
    page.get_by_role("tab", name="Layouts").click()
    grid = page.locator(".st-key-layouts_table [data-testid='stDataFrame']").first
    sync_api.expect(grid).to_be_visible(timeout=30_000)
    grid.scroll_into_view_if_needed()  # a mouse click at page coordinates must land inside the viewport
    box = grid.bounding_box()
    # the grid is a canvas: click the row-selection cell of the second row (header ~35 px, rows ~35 px)
    page.mouse.click(box["x"] + 14, box["y"] + 35 + 35 + 17)
    sync_api.expect(page).to_have_url(re.compile(r"zero_stage=\d"), timeout=30_000)
    pinned = page.url
    # the URL alone restores the pinned scenario in a new page
    page.goto(pinned)
    sync_api.expect(_metric(page, "time to train")).to_contain_text("days", timeout=60_000)
    sync_api.expect(page.get_by_text("pinned:", exact=False)).to_be_visible()
    assert page.url.split("?")[1].split("&tab=")[0] == pinned.split("?")[1].split("&tab=")[0]


def test_the_hardware_sweep_fills_in_by_itself(browser_page):
    """The days-vs-GPUs sweep is computed a step at a time: its chart reruns alone (a fragment)
    until every profile is drawn, with no click."""
    page, server = browser_page
    page.goto(f"{server}/?tab=Hardware&params=14")
    # About 4 s of work on a quiet 2-core machine, in slices between polls: a generous bound for a busy one.
    sync_api.expect(page.get_by_text("Fastest fitting layout per point", exact=False)).to_be_visible(timeout=240_000)
    sync_api.expect(page.get_by_text("profiles drawn so far", exact=False)).to_have_count(0)
    sync_api.expect(page.get_by_role("heading", name="Hardware comparison on 128 GPUs")).to_be_visible()


def test_the_plan_pictures_fill_in_by_themselves(browser_page):
    """The Plan tab's what-if pictures are computed a step at a time: they rerun alone (a fragment)
    until the step-time picture's five GPU counts are searched, with no click."""
    page, server = browser_page
    page.goto(f"{server}/?params=69")
    sync_api.expect(_metric(page, "time to train")).to_contain_text("days", timeout=60_000)
    # About 0.1 s of work on a quiet 2-core machine, in slices between polls: a generous bound for a busy one.
    sync_api.expect(page.get_by_text("The best layout's step parts", exact=False)).to_be_visible(timeout=120_000)
    sync_api.expect(page.get_by_text("Searching the best layout at each GPU count", exact=False)).to_have_count(0)


def test_a_click_while_the_page_draws_keeps_every_other_value(browser_page):
    """A click on a sidebar group as soon as it is drawn, while the rest of the page (the plan, the
    Plan tab's pictures) is still being drawn: before planner.app.page.send_values_with_the_widgets,
    the browser sent back widget defaults for values it had dropped (GPUs 0, the first GPU profile,
    overlap off: 5-7 of 12 such tries on a loaded 2-core machine); now only the field set changes.
    Three tries, each a new session."""
    page, server = browser_page
    for _ in range(3):
        page.goto(server)
        group = page.get_by_text("Custom hardware (overrides the profile)", exact=True)
        group.wait_for(timeout=60_000)
        group.click()
        memory = page.get_by_label("GPU memory, GiB", exact=True)
        sync_api.expect(memory).to_be_visible(timeout=30_000)
        memory.fill("40")
        memory.press("Enter")
        sync_api.expect(page).to_have_url(f"{server}/?gpu_memory_gib=40", timeout=30_000)
        sync_api.expect(_metric(page, "memory per GPU")).to_contain_text("/40 GiB", timeout=30_000)


def test_a_closed_group_opens_on_a_click_and_keeps_its_values_when_closed(browser_page):
    """The sidebar's rarely changed groups draw their fields only while open (an expander that
    reruns the page when clicked); closed again, what was set in them still counts."""
    page, server = browser_page
    page.goto(server)
    sync_api.expect(_metric(page, "time to train")).to_contain_text("days", timeout=60_000)
    memory = page.get_by_label("GPU memory, GiB", exact=True)
    sync_api.expect(memory).to_have_count(0)  # closed: not drawn
    group = page.get_by_text("Custom hardware (overrides the profile)", exact=True)
    group.click()
    sync_api.expect(memory).to_be_visible(timeout=30_000)
    memory.fill("40")
    memory.press("Enter")
    sync_api.expect(page).to_have_url(f"{server}/?gpu_memory_gib=40", timeout=30_000)
    sync_api.expect(_metric(page, "memory per GPU")).to_contain_text("/40 GiB", timeout=30_000)
    group.click()
    sync_api.expect(memory).to_have_count(0, timeout=30_000)
    page.get_by_label("GPUs", exact=True).fill("256")
    page.get_by_label("GPUs", exact=True).press("Enter")
    sync_api.expect(page).to_have_url(f"{server}/?gpus=256&gpu_memory_gib=40", timeout=30_000)
    sync_api.expect(_metric(page, "memory per GPU")).to_contain_text("/40 GiB", timeout=30_000)


# --- issue 37: the screenshots in docs/app.md, taken here ------------------------------------------
DOCS = APP.parent / "docs"


def _shot(page, locator, name: str, tmp_path: Path) -> Path:
    """A screenshot of ``locator`` (docs/<name> when PLANNER_UPDATE_SCREENSHOTS=1, else tmp_path)."""
    import os

    where = DOCS if os.environ.get("PLANNER_UPDATE_SCREENSHOTS") == "1" else tmp_path
    path = where / name
    locator.screenshot(path=path)
    assert path.stat().st_size > 10_000
    return path


def test_the_docs_screenshots(browser_page, tmp_path):
    """The explorer as docs/app.md shows it: the MoE headline naming expert parallel as the CLI
    does, the Runs tab predicting the committed CPU runs on the calibrated CPU profile, and the
    Hardware tab's chart with the plan's GPU and the fastest few in colour."""
    page, server = browser_page
    main = page.locator('[data-testid="stMain"]')
    page.goto(f"{server}/?model=preset&preset=mixtral-8x7b&gpus=64&ep=8")
    sync_api.expect(_metric(page, "time to train")).to_contain_text("days", timeout=60_000)
    sync_api.expect(page.get_by_text("(ep 8 of dp*cp)", exact=False).first).to_be_visible()  # the headline
    _shot(page, main, "app-headline-ep.png", tmp_path)

    page.goto(f"{server}/?tab=Runs")
    sync_api.expect(page.get_by_role("heading", name="Predicted vs measured")).to_be_visible(timeout=60_000)
    sync_api.expect(page.get_by_text("--gpu cpu-2core", exact=False)).to_be_visible(timeout=30_000)
    sync_api.expect(page.get_by_text("page computed and drawn in", exact=False)).to_be_visible(timeout=30_000)
    sync_api.expect(page.get_by_text("no prediction", exact=False)).to_have_count(0)
    panel = page.get_by_role("tabpanel").filter(has_text="Predicted vs measured")
    chart = panel.locator('[data-testid="stVegaLiteChart"]').first
    sync_api.expect(chart).to_contain_text("step_s", timeout=30_000)  # a panel per quantity, drawn
    page.set_viewport_size({"width": 1500, "height": 2400})  # the whole tab in view: no lazy painting
    page.wait_for_timeout(1000)
    _shot(page, panel, "app-runs.png", tmp_path)
    page.set_viewport_size({"width": 1500, "height": 1100})

    page.goto(f"{server}/?tab=Hardware&params=7")
    sync_api.expect(page.get_by_text("Fastest fitting layout per point", exact=False)).to_be_visible(timeout=240_000)
    # Both views done (the comparison table too: its fragment redraws the chart until then), and the
    # page's one run after that drawn: no element the screenshot takes is replaced under it.
    sync_api.expect(page.get_by_text("profiles so far", exact=False)).to_have_count(0, timeout=240_000)
    page.wait_for_timeout(1000)
    chart = page.locator('[data-testid="stVegaLiteChart"]').first
    sync_api.expect(chart).to_contain_text("days to train (log scale)", timeout=30_000)
    sync_api.expect(chart).to_contain_text("GPUs (log scale)")
    sync_api.expect(chart).to_contain_text("a100-80g")  # the plan's GPU, in colour and named
    for attempt in range(3):  # a chart redrawn while its picture is taken: taken again
        try:
            _shot(page, page.locator('[data-testid="stVegaLiteChart"]').first, "app-hardware.png", tmp_path)
            break
        except sync_api.Error as err:
            if "not attached" not in str(err) or attempt == 2:
                raise
            page.wait_for_timeout(1000)
