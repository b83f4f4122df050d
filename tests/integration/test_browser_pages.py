"""The gateway's pages as a laptop's browser shows them, in a real headless Chromium that reaches
nothing outside this machine: the API docs draw from the gateway's own assets, and the console's
tables stay inside their cards at 1280 px wide."""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from typing import Any

import pytest
from selenium.common.exceptions import JavascriptException
from selenium.webdriver.chrome.webdriver import WebDriver

from bench.console_shot import chromium
from inferq.shared.schemas import TERMINAL_STATUSES
from tests.conftest import Stack
from tests.integration.test_console import WAIT, WORKER_ROWS, Console
from tests.wait import eventually

pytestmark = pytest.mark.integration
WIDTH, HEIGHT = 1280, 900
JOBS = 3
#: The page's width, and for each table: its rows, its card's edges and whether anything in the
#: card is wider than the card (scrollWidth > clientWidth: it spills out of it).
LAYOUT = """
const out = {page: document.documentElement.scrollWidth, inner: window.innerWidth, tables: {}};
for (const id of ["workers", "jobs"]) {
  const table = document.getElementById(id), card = table.closest(".panel"), r = card.getBoundingClientRect();
  out.tables[id] = {rows: table.tBodies[0].rows.length, left: r.left, right: r.right,
                    scroll: card.scrollWidth, client: card.clientWidth};
}
return out;"""

#: Every page keeps what its Content-Security-Policy blocked, as "directive URL".
RECORD_CSP = """window.cspBlocked = [];
document.addEventListener("securitypolicyviolation",
                          (e) => window.cspBlocked.push(e.effectiveDirective + " " + e.blockedURI));"""


@pytest.fixture(scope="module")
def browser() -> Iterator[WebDriver]:
    """A headless Chromium whose page is exactly WIDTH x HEIGHT CSS pixels."""
    assert shutil.which("chromium") and shutil.which("chromedriver"), \
        "chromium and chromedriver are not installed (make setup installs them)"
    with chromium(WIDTH, HEIGHT) as driver:
        driver.execute_cdp_cmd("Emulation.setDeviceMetricsOverride",
                               {"width": WIDTH, "height": HEIGHT, "deviceScaleFactor": 1, "mobile": False})
        driver.execute_cdp_cmd("Page.addScriptToEvaluateOnNewDocument", {"source": RECORD_CSP})
        yield driver


def count(driver: WebDriver, selector: str) -> int:
    return int(driver.execute_script("return document.querySelectorAll(arguments[0]).length", selector))


def resources(driver: WebDriver) -> list[str]:
    """Every URL the page loaded (scripts, styles, images, the schema)."""
    return list(driver.execute_script("return performance.getEntriesByType('resource').map(e => e.name)"))


@pytest.mark.parametrize("page, drawn, title", [
    ("/docs", ".swagger-ui .opblock", ".swagger-ui .info .title"),
    ("/redoc", "[data-section-id*='operation/']", ".api-info h1"),
])
def test_api_docs_draw_offline(stack: Stack, browser: WebDriver, page: str, drawn: str, title: str) -> None:
    with stack.http() as http:
        operations = sum(len(ops) for ops in http.get("/openapi.json").json()["paths"].values())
    browser.get(stack.base + page)
    eventually(lambda: count(browser, drawn) >= operations > 10, WAIT, f"{page} to draw every operation",
               interval=0.2, ignore=(JavascriptException,))
    assert browser.execute_script("return document.querySelector(arguments[0]).textContent", title).startswith(
        "inferq")
    loaded = resources(browser)
    assert any(u.endswith(".js") for u in loaded) and f"{stack.base}/openapi.json" in loaded, loaded
    # nothing came from elsewhere: the one try, ReDoc's logo, was blocked by the page's policy,
    # which kept out nothing the pages need (only images from elsewhere)
    blocked = browser.execute_script("return window.cspBlocked")
    assert [b for b in blocked if not b.startswith("img-src http")] == [], blocked
    outside = {u for u in loaded if not u.startswith(stack.base + "/")}
    assert outside <= {b.split(" ", 1)[1] for b in blocked}, (outside, blocked)


def test_console_tables_fit_their_cards_at_1280(stack: Stack, browser: WebDriver) -> None:
    page = Console(browser, stack.base).open()
    job_id = None
    for i in range(JOBS):  # jobs sent from the page fill its jobs table
        page.send(f"def fits_in_its_card_{i}(table, card, page_width=1280):", 4, ignore_eos=True)
        job_id = page.job_id(previous=job_id)
        page.wait(lambda: page.text("status") in TERMINAL_STATUSES, "the job's end")
    page.wait(lambda: page.js(WORKER_ROWS) == len(stack.workers) and page.js(
        "return document.querySelectorAll('#jobs tbody tr').length") == JOBS, "the workers and the jobs listed")
    layout: dict[str, Any] = page.js(LAYOUT)
    assert layout["inner"] == WIDTH, layout
    assert layout["page"] <= layout["inner"], f"the page scrolls sideways: {layout}"
    for table, box in layout["tables"].items():
        assert box["rows"] > 0, (table, layout)
        assert box["left"] >= 0 and box["right"] <= layout["inner"], f"the {table} card leaves the page: {layout}"
        assert box["scroll"] <= box["client"], f"the {table} table spills out of its card: {layout}"
