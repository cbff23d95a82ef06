"""Headless Chromium for the page tests: one place that finds it, or skips with how to get it."""
import os
import shutil
import time

import pytest


def headless_chromium(console_log=False):
    """A selenium Chrome driver on headless Chromium; ``pytest.skip`` with the install line
    where chromium, chromedriver or selenium is missing. ``console_log``: keep the page's
    console messages (``driver.get_log("browser")``)."""
    chromium = shutil.which("chromium") or shutil.which("chromium-browser")
    driver = shutil.which("chromedriver")
    if not chromium or not driver:
        pytest.skip("no chromium/chromedriver: apt-get install -y chromium chromium-driver")
    try:
        from selenium import webdriver
        from selenium.webdriver.chrome.options import Options
        from selenium.webdriver.chrome.service import Service
    except ImportError:
        pytest.skip("no selenium: pip install selenium (the test extra)")
    opts = Options()
    opts.binary_location = chromium
    for a in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
              "--window-size=1400,1000"):
        opts.add_argument(a)
    if console_log:
        opts.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    return webdriver.Chrome(service=Service(driver), options=opts)


def open_page(driver, path, timeout=60):
    """Load the page at ``path`` and wait until its script marks it ready (``body[data-ready=1]``)."""
    driver.get("file://" + os.path.abspath(path))
    t = time.time()
    while driver.execute_script("return document.body && document.body.dataset.ready") != "1":
        assert time.time() - t < timeout, "the page never became ready"
        time.sleep(0.05)
