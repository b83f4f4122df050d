"""The browser console (``GET /console``) driven in a real headless Chromium: against the session
stack, and against a second gateway with API keys that shares its Redis and workers.

Nothing here depends on how fast the machine is: a job that ends before the page was seen
streaming it (or before Cancel reached it) proves nothing either way and is run again.
"""

from __future__ import annotations

import re
import shutil
import sys
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest
from selenium.common.exceptions import NoSuchElementException
from selenium.webdriver.chrome.webdriver import WebDriver
from selenium.webdriver.common.by import By

from bench.console_shot import chromium
from inferq.shared.schemas import TERMINAL_STATUSES
from tests.conftest import ADAPTER_SEEDS, Service, Stack, free_port, http_ok, inferq_env, spawn
from tests.helpers import LONG_JOB, submit, wait_status
from tests.wait import eventually

pytestmark = pytest.mark.integration
WAIT = 120  # seconds: generous, for a busy 2-core machine
LONG = 1900  # tokens, with ignore_eos: a job that streams for a while and ends
TRIES = 3
KEY = "sk-console"
WORKER_ROWS = "return document.querySelectorAll('#workers tbody tr').length"
IDS = ("api-key", "prompt", "model", "max-tokens", "temperature", "top-p", "priority", "ignore-eos", "send",
       "cancel", "status", "job-id", "output", "jobs", "queue", "workers")


@pytest.fixture(scope="module")
def browser() -> Iterator[WebDriver]:
    """One headless Chromium for the module (each test loads the page afresh); quit at the end."""
    assert shutil.which("chromium") and shutil.which("chromedriver"), \
        "chromium and chromedriver are not installed (make setup installs them)"
    with chromium(1400, 1000) as driver:
        yield driver


@dataclass
class Keyed:
    base: str
    gateway: Service

    def http(self, key: str | None = KEY) -> httpx.Client:
        headers = {"Authorization": f"Bearer {key}"} if key else {}
        return httpx.Client(base_url=self.base, timeout=60, headers=headers)


@pytest.fixture(scope="module")
def keyed(stack: Stack, logdir: Path) -> Iterator[Keyed]:
    """A gateway with an API key, on the session's Redis and workers."""
    port = free_port()
    gw = spawn("gateway-console-keys", [sys.executable, "-m", "inferq.cli", "api", "--port", str(port)],
               inferq_env(stack.redis.url, INFERQ_API_KEYS=KEY), logdir)
    try:
        eventually(lambda: http_ok(f"http://127.0.0.1:{port}/readyz"), 60, "the gateway with an API key", procs=[gw],
                   interval=0.2)
        yield Keyed(f"http://127.0.0.1:{port}", gw)
    finally:
        gw.stop()


class Console:
    """The page, as a person uses it: its elements by their ids."""

    def __init__(self, driver: WebDriver, base: str) -> None:
        self.driver, self.base = driver, base

    def open(self) -> Console:
        self.driver.get(f"{self.base}/console")
        self.wait(lambda: self.text("status") == "idle", "the page to load")
        return self

    def wait(self, predicate: Callable[[], Any], what: str, timeout: float = WAIT) -> Any:
        """Until ``predicate()`` is truthy (an element not there yet counts as not yet, as for
        Selenium's own waits); its value."""
        return eventually(predicate, timeout, what, interval=0.1, ignore=(NoSuchElementException,))

    def js(self, script: str, *args: Any) -> Any:
        return self.driver.execute_script(script, *args)

    def text(self, element_id: str) -> str:
        """The element's text exactly as the page holds it (no whitespace folding)."""
        return str(self.js("return document.getElementById(arguments[0]).textContent", element_id))

    def visible(self, element_id: str) -> bool:
        return self.driver.find_element(By.ID, element_id).is_displayed()

    def type(self, element_id: str, value: object) -> None:
        field = self.driver.find_element(By.ID, element_id)
        field.clear()
        field.send_keys(str(value))

    def send(self, prompt: str, max_tokens: int, ignore_eos: bool = True) -> None:
        # the page takes a new job once the last one's socket closed (send is enabled again)
        self.wait(lambda: not self.driver.find_element(By.ID, "send").get_attribute("disabled"), "send enabled")
        self.type("prompt", prompt)
        self.type("max-tokens", max_tokens)
        box = self.driver.find_element(By.ID, "ignore-eos")
        if box.is_selected() != ignore_eos:
            box.click()
        self.driver.find_element(By.ID, "send").click()

    def job_id(self, previous: str | None = None) -> str:
        """The id the job just sent got (shown once the gateway accepted it), not ``previous``."""
        return str(self.wait(lambda: self.text("job-id") not in ("", previous) and self.text("job-id"),
                             "the job's id"))

    def listed_status(self, job_id: str) -> str | None:
        """The job's status in the jobs list."""
        return self.js("const c = document.querySelector(`#jobs tr[data-job-id='${arguments[0]}'] .status`);"
                       "return c && c.textContent", job_id)

    def click(self, element_id: str) -> None:
        self.driver.find_element(By.ID, element_id).click()


def test_console_is_served_with_the_package(stack: Stack) -> None:
    with stack.http() as http:
        page = http.get("/console")
        assert page.status_code == 200 and page.headers["content-type"].startswith("text/html")
        for element_id in IDS:
            assert f'id="{element_id}"' in page.text, element_id
        assert "frame-ancestors 'none'" in page.headers["content-security-policy"]
        scripts = http.get("/console/console.js").text + http.get("/console/console.css").text
        assert "://" not in page.text and not re.search(r"https?://", scripts)  # nothing from elsewhere
        root = http.get("/", follow_redirects=False)
        assert root.status_code == 307 and http.get("/", follow_redirects=True).url.path == "/console"
        assert http.get("/console/console.js").headers["content-type"].startswith("text/javascript")
        assert http.get("/console/console.css").headers["content-type"].startswith("text/css")
        for missing in ("/console/index.html", "/console/..%2Fconsole.py", "/console/nothing.js"):
            assert http.get(missing).status_code == 404, missing
        paths = http.get("/openapi.json").json()["paths"]
        assert "/v1/queue" in paths and "/console" not in paths and "/" not in paths


def test_queue_endpoint_reports_each_model_by_priority(stack: Stack) -> None:
    with stack.http() as http:
        body = http.get("/v1/queue").json()
        live = len(http.get("/v1/workers").json())
    (tiny,) = [m for m in body["models"] if m["model"] == "inferq-tiny"]
    assert set(tiny["by_priority"]) == {str(p) for p in range(10)}
    assert tiny["queued"] == sum(tiny["by_priority"].values()) >= 0
    assert tiny["running"] >= 0 and tiny["workers"] == live == len(stack.workers)
    assert isinstance(body["at"], float)


def test_send_streams_tokens_while_the_job_runs(stack: Stack, browser: WebDriver) -> None:
    page = Console(browser, stack.base).open()
    with stack.http() as http:
        partial, job_id = "", None
        for _ in range(TRIES):
            page.send("def stream():", LONG)
            job_id = page.job_id(previous=job_id)

            def shown_or_over(job_id: str = job_id) -> bool:
                nonlocal partial
                out = page.text("output")  # read first: if the job still runs after, it ran then
                status = http.get(f"/v1/jobs/{job_id}").json()["status"]
                if out and status == "running":
                    partial = out
                return bool(partial) or status in TERMINAL_STATUSES

            page.wait(shown_or_over, "tokens on the page, or the job's end")
            page.wait(lambda: page.text("status") in TERMINAL_STATUSES, "the stream's end")
            view = wait_status(http, job_id)
            assert view["status"] == page.text("status") == "succeeded", view
            assert view["usage"]["completion_tokens"] == LONG
            assert page.text("output") == view["text"]  # every token, in order, nothing else
            page.wait(lambda job_id=job_id: page.listed_status(job_id) == "succeeded", "the jobs list to say succeeded")
            if partial:
                break
        assert partial, f"the output never showed while the job ran ({TRIES} tries)"
        assert view["text"].startswith(partial)  # what was shown then was the start of it


def test_cancel_ends_the_job_cancelled(stack: Stack, browser: WebDriver) -> None:
    page = Console(browser, stack.base).open()
    with stack.http() as http:
        job_id = None
        for _ in range(TRIES):
            page.send("def cancel_me():", LONG_JOB)
            job_id = page.job_id(previous=job_id)
            # a token counted (its text may still be empty: an incomplete UTF-8 sequence), or the end
            page.wait(lambda: int(page.text("tokens") or 0) > 0 or page.text("status") in TERMINAL_STATUSES,
                      "tokens on the page, or the job's end")
            if page.text("status") not in TERMINAL_STATUSES:
                page.click("cancel")
            view = wait_status(http, job_id)
            if view["status"] == "succeeded" and view["usage"]["completion_tokens"] == LONG_JOB:
                continue  # it ran to its end before the cancel reached it
            break
        assert view["status"] == "cancelled", view
        assert view["finish_reason"] == "cancelled"
        page.wait(lambda: page.listed_status(job_id) == "cancelled", "the jobs list to say cancelled")
        page.wait(lambda: page.text("status") == "cancelled", "the page's status to say cancelled")
        assert not browser.find_element(By.ID, "send").get_attribute("disabled")
        assert browser.find_element(By.ID, "cancel").get_attribute("disabled")
        assert view["text"].startswith(page.text("output"))  # what came before the cancel


def test_workers_and_queue_are_live(stack: Stack, browser: WebDriver) -> None:
    page = Console(browser, stack.base).open()
    with stack.http() as http:
        workers = {w["id"] for w in http.get("/v1/workers").json()}
    assert len(workers) == len(stack.workers) == 2

    def rows() -> dict[str, dict[str, str]]:
        return page.js("""const out = {};
            for (const tr of document.querySelectorAll('#workers tbody tr[data-worker-id]')) {
              out[tr.dataset.workerId] = {kv: tr.querySelector('.kv').dataset.kv,
                kv_text: tr.querySelector('.kv').textContent,
                running: tr.querySelector('.running').textContent,
                waiting: tr.querySelector('.waiting').textContent,
                adapters: tr.querySelector('.adapters').textContent,
                classes: tr.querySelector('.classes').textContent,
                hits: tr.querySelector('.hits').textContent};
            }
            return out;""")

    page.wait(lambda: set(rows()) == workers, "both workers in the workers panel")
    for wid, row in rows().items():
        assert 0.0 <= float(row["kv"]) <= 1.0, (wid, row)
        assert re.fullmatch(r"\d+\.\d%", row["kv_text"]), (wid, row)
        assert int(row["running"]) >= 0 and int(row["waiting"]) >= 0, (wid, row)
        assert re.fullmatch(r"\d+\.\d%|—", row["hits"]), (wid, row)
        assert re.search(r"\(limit \d+ of \d+ \+\d+\)$", row["classes"]), (wid, row)  # its service classes
    with stack.http() as http:  # each worker's LoRA adapters, as its heartbeat says (they change as jobs use them)
        assert wait_status(http, submit(http, prompt="x", model="tiny-a", max_tokens=2))["status"] == "succeeded"
        page.wait(lambda: any("tiny-a" in row["adapters"] for row in rows().values()), "tiny-a in a worker's row")
        page.wait(lambda: {wid: row["adapters"] for wid, row in rows().items()} == {
            w["id"]: ", ".join(w["adapters"]) or "—" for w in http.get("/v1/workers").json()},
            "each worker's adapters in the panel")
    model = "#queue [data-model='inferq-tiny']"
    page.wait(lambda: page.js(f"return document.querySelector(\"{model} .live\")"), "the model's queue")
    live = page.js(f"return document.querySelector(\"{model} .live\").textContent")
    assert live == "2"
    for field in ("queued", "running"):
        assert int(page.js(f"return document.querySelector(\"{model} .{field}\").textContent")) >= 0
    assert len(browser.find_elements(By.CSS_SELECTOR, f"{model} .prio span")) == 10
    classes = [e.get_attribute("data-name") for e in browser.find_elements(By.CSS_SELECTOR, f"{model} .classes span")]
    assert sorted(classes) == ["batch", "interactive"], classes  # queued / running of each service class
    first = page.text("updated")
    page.wait(lambda: page.text("updated") != first, "the panel's next refresh")

    # A job that runs shows in both panels (one that ends before a refresh is tried again).
    with stack.http() as http:
        for _ in range(TRIES):
            job_id = submit(http, prompt="def busy():", max_tokens=LONG_JOB, ignore_eos=True)

            def running_or_over(job_id: str = job_id) -> str | None:
                queue = int(page.js(f"return document.querySelector(\"{model} .running\").textContent"))
                if queue and any(int(r["running"]) for r in rows().values()):
                    return "running"
                over = http.get(f"/v1/jobs/{job_id}").json()["status"] in TERMINAL_STATUSES
                return "over" if over else None

            seen = page.wait(running_or_over, "the running job in the panels")
            http.delete(f"/v1/jobs/{job_id}")
            wait_status(http, job_id)
            if seen == "running":
                break
        assert seen == "running"


def test_api_key_from_the_page(keyed: Keyed, browser: WebDriver) -> None:
    with keyed.http(None) as anonymous:
        assert anonymous.get("/console").status_code == 200  # static: no key needed
        assert anonymous.get("/v1/queue").status_code == 401
    with keyed.http() as http:
        assert http.get("/v1/queue").status_code == 200

    page = Console(browser, keyed.base).open()  # this origin's localStorage holds no key yet
    page.wait(lambda: page.visible("auth-error"), "the authentication error")
    assert "authentication_error" in page.text("auth-error") and "API key" in page.text("auth-error")
    page.send("no key", 4)
    page.wait(lambda: page.text("status") == "rejected", "the socket to be refused")
    assert "authentication_error" in page.text("error") and page.text("job-id") == ""

    page.type("api-key", KEY)
    page.wait(lambda: not page.visible("auth-error"), "the error to go once the key is in")
    page.wait(lambda: page.js("return [...document.querySelectorAll('#model option')].map(o => o.value)")
              == ["inferq-tiny", *ADAPTER_SEEDS], "the models the key may see: the model, then its adapters")
    page.wait(lambda: page.js(WORKER_ROWS) == 2, "the workers")
    page.send("with a key", 8)
    job_id = page.job_id()
    page.wait(lambda: page.text("status") in TERMINAL_STATUSES, "the job's end")
    with keyed.http() as http:
        view = http.get(f"/v1/jobs/{job_id}").json()
    assert view["status"] == page.text("status") == "succeeded" and page.text("output") == view["text"]
    assert not page.visible("error")
    page.wait(lambda: page.listed_status(job_id) == "succeeded", "the jobs list")

    page.open()  # the key is kept in the browser
    assert browser.find_element(By.ID, "api-key").get_attribute("value") == KEY
    page.wait(lambda: page.js(WORKER_ROWS) == 2, "the workers")
    assert not page.visible("auth-error")
