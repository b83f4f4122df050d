"""``python -m bench console-shot``: a screenshot of the browser console (``GET /console``) of a
running gateway (``make run``), in headless Chromium, as docs/img/console.png shows it.

The page is used as a person would: a short job, a long one cancelled, then a long one streaming
while a few jobs sent over REST keep the workers busy; the shot is taken mid-stream, and every
job it started is cancelled before it exits. Needs Debian's chromium and chromium-driver
(``make setup``) and selenium (the ``test`` extra).
"""

from __future__ import annotations

import argparse
import shutil
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx

from bench.stack import ROOT

TERMINAL = ("succeeded", "failed", "cancelled")
LONG = 1900  # tokens (the tiny model's context is 8,192): a job that streams a while and ends


@contextmanager
def chromium(width: int, height: int) -> Iterator[Any]:
    """A headless Chromium through Debian's chromedriver (Selenium Manager never downloads one)."""
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    binary, driver_path = shutil.which("chromium"), shutil.which("chromedriver")
    if not binary or not driver_path:
        raise SystemExit("chromium and chromedriver are needed: make setup installs them")
    opts = webdriver.ChromeOptions()
    opts.binary_location = binary
    for arg in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage", "--hide-scrollbars",
                f"--window-size={width},{height}"):
        opts.add_argument(arg)
    driver = webdriver.Chrome(service=Service(executable_path=driver_path), options=opts)
    try:
        yield driver
    finally:
        try:  # a page's live connections (the console's streams) closed first: Chromium then quits at once
            driver.get("about:blank")
        finally:
            driver.quit()


def shoot(base: str, out: Path, api_key: str | None, width: int = 1400, height: int = 1000) -> None:
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import WebDriverWait

    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    with chromium(width, height) as driver, httpx.Client(base_url=base, headers=headers, timeout=60) as http:
        def wait(predicate: Callable[[], Any], timeout: float = 120) -> Any:
            return WebDriverWait(driver, timeout, poll_frequency=0.1).until(lambda _: predicate())

        def text(element_id: str) -> str:
            script = "return document.getElementById(arguments[0]).textContent"
            return str(driver.execute_script(script, element_id))

        def fill(element_id: str, value: object) -> None:
            field = driver.find_element(By.ID, element_id)
            field.clear()
            field.send_keys(str(value))

        def send(prompt: str, max_tokens: int) -> None:
            fill("prompt", prompt)
            fill("max-tokens", max_tokens)
            driver.find_element(By.ID, "send").click()
            wait(lambda: text("job-id"))

        driver.get(f"{base}/console")
        if api_key:
            fill("api-key", api_key)
        wait(lambda: driver.find_elements(By.CSS_SELECTOR, "#workers tbody tr"))
        driver.find_element(By.ID, "ignore-eos").click()
        send("def fibonacci(n):", 48)
        wait(lambda: text("status") in TERMINAL)
        send("class PriorityQueue:", LONG)
        wait(lambda: len(text("output")) > 200 or text("status") in TERMINAL)
        if text("status") not in TERMINAL:
            driver.find_element(By.ID, "cancel").click()
        wait(lambda: text("status") in TERMINAL)
        busy = [http.post("/v1/jobs", json={"prompt": f"job {i}:", "max_tokens": LONG, "ignore_eos": True,
                                            "priority": 5 + i}).json()["id"] for i in range(3)]
        try:
            send("Once upon a time, in a queue far away,", LONG)
            wait(lambda: len(text("output")) > 1500 or text("status") in TERMINAL)
            wait(lambda: int(driver.execute_script(
                "return +(document.querySelector('#queue .running') || {}).textContent || 0")) > 0, 30)
            out.parent.mkdir(parents=True, exist_ok=True)
            driver.save_screenshot(str(out))
            if driver.find_element(By.ID, "cancel").is_enabled():
                driver.find_element(By.ID, "cancel").click()
        finally:
            for job_id in busy:
                http.delete(f"/v1/jobs/{job_id}")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench console-shot", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--base-url", default="http://127.0.0.1:8000", help="the gateway (default: make run's)")
    p.add_argument("--api-key", help="a key, when the gateway has INFERQ_API_KEYS")
    p.add_argument("--out", default=str(ROOT / "docs" / "img" / "console.png"))
    a = p.parse_args(argv)
    shoot(a.base_url.rstrip("/"), Path(a.out), a.api_key)
    print(a.out)
    return 0
