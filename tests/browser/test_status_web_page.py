"""`zmqflow status --web` in a real headless Chromium (Debian's, driven by Selenium) against a training job:
broker, ps shard and 2 workers training a CSV with the chief validating every second, and an aggregator whose
only member is gone. The page shows every task up, the aggregator's member, the train queue and
both workers' rates; the loss chart gains points between two reads and the validation chart has some. A
screenshot is left at the printed path ($ZMQFLOW_SCREENSHOT_DIR, else the test's tmp dir). `make test-browser`
installs what it needs; without Chromium, chromedriver or Selenium the test skips, naming what is missing.
"""

import os
import re
import shutil
import sys
import time

import pytest

import zmqflow
from tests.integration.test_train_on_data import write_flowers
from tests.support import free_port, wait_for

pytestmark = [pytest.mark.integration, pytest.mark.browser]

CHROMIUM = "/usr/bin/chromium"
CHROMEDRIVER = shutil.which("chromedriver") or "/usr/bin/chromedriver"
FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
         "--disable-background-networking", "--disable-component-update", "--disable-sync",
         "--window-size=1400,1900"]


MEMBER = f"tcp://127.0.0.1:{free_port()}"     # nothing serves there: the member never answers


@pytest.fixture
def browser(tmp_path):
    """A headless Chromium with a new, empty profile; quit at the end."""
    missing = [what for what, there in ((CHROMIUM, os.access(CHROMIUM, os.X_OK)),
                                        (CHROMEDRIVER, os.access(CHROMEDRIVER, os.X_OK))) if not there]
    try:
        from selenium import webdriver
        from selenium.webdriver.chrome.service import Service
    except ImportError:
        missing.append("selenium (pip install selenium)")
    if missing:
        pytest.skip("needs " + ", ".join(missing) + ": make test-browser installs them")
    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for flag in FLAGS + [f"--user-data-dir={tmp_path / 'profile'}"]:
        options.add_argument(flag)
    driver = webdriver.Chrome(service=Service(CHROMEDRIVER), options=options)
    driver.set_page_load_timeout(30)
    yield driver
    driver.quit()


@pytest.fixture
def training(tmp_path, monkeypatch, processes):
    """A job training for minutes (stopped by the test's end) with every task's metrics on a free port."""
    monkeypatch.setenv("ZMQFLOW_METRICS_BIND", "0")
    job = zmqflow.local_cluster(num_ps=1, num_workers=2, data=write_flowers(tmp_path), model="mlp", epochs=5000,
                                batch_size=20, validate_every_secs=1.0, log_dir=str(tmp_path / "job"))
    aggregator = processes.service("zmqflow.services.aggregator", ["--member", MEMBER])
    try:
        job.start()
        yield job, aggregator
    finally:
        job.stop()


def test_the_page_shows_each_task_and_its_charts_grow(browser, training, processes, tmp_path):
    job, aggregator = training
    workers = job.cluster.workers
    metrics = [wait_for(lambda w=w: re.search(r"metrics on (http://\S+)", w.log()), 60, f"{w.name}'s metrics")
               .group(1) for w in workers]
    view = processes.start("status-web", [
        sys.executable, "-m", "zmqflow", "status", "--web", "--web-bind", "0", "--interval-secs", "0.5",
        "--broker", job.cluster.broker.endpoint, "--ps", job.cluster.shards[0].endpoint,
        "--aggregator", aggregator.endpoint, "--worker-metrics", ",".join(metrics)],
        log_path=str(tmp_path / "status-web.log"))
    url = wait_for(lambda: re.search(r"web view on (http://\S+)", view.log()), 20, "the web view's URL").group(1)

    started = time.monotonic()
    browser.get(url)

    def rows(table):
        return browser.execute_script(
            "return [...document.querySelectorAll('#' + arguments[0] + ' tbody tr')]"
            ".map(tr => [...tr.children].map(td => td.textContent));", table)

    def cells(table, key):
        return next((row for row in rows(table) if row[0] == key), None)

    def points(chart):
        return int(browser.find_element("id", chart).get_attribute("data-points"))

    wait_for(lambda: all((cells("tasks", t) or [None] * 3)[2] == "up" for t in ("broker:0", "ps:0", "aggregator:0")),
             30, "broker, ps and aggregator shown up")
    shown = time.monotonic() - started
    wait_for(lambda: all((cells("workers", f"worker:{i}") or [None] * 5)[3] == "up" and
                         cells("workers", f"worker:{i}")[4] != "-" for i in (0, 1)), 30, "both workers' examples/s")
    assert cells("queues", "broker:0")[1] == "train"
    member = cells("members", "aggregator:0")
    assert member[1] == MEMBER and member[2] in ("yes", "no") and member[3] == "0", member
    first = wait_for(lambda: points("chart-loss") >= 2 and points("chart-loss"), 30, "loss points")
    wait_for(lambda: points("chart-loss") > first, 15, "the loss chart growing")
    second = points("chart-loss")
    validation = wait_for(lambda: points("chart-validation"), 30, "a validation point")
    refreshes = int(browser.find_element("id", "updated").get_attribute("data-refreshes"))
    print(f"page shown with every task up in {shown:.1f} s; loss chart {first} -> {second} points, "
          f"validation chart {validation} points, {refreshes} refreshes, {points('chart-rates')} rate points")
    assert second > first and validation >= 1 and refreshes >= 2
    assert cells("shards", "ps:0")[1] not in ("-", "0")

    wait_for(lambda: points("chart-loss") >= 8, 20, "8 loss points for the screenshot")
    directory = os.environ.get("ZMQFLOW_SCREENSHOT_DIR") or str(tmp_path)
    os.makedirs(directory, exist_ok=True)
    path = os.path.join(directory, "zmqflow-status-web.png")
    assert browser.save_screenshot(path) and os.path.getsize(path) > 10_000
    print(f"screenshot: {path}")
