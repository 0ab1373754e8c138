"""The dashboard pages in headless Chromium (Playwright driving /usr/bin/chromium) against a live app on a seeded
store.

Scenarios: each page (sweeps list, one sweep, tuning, history) loads with no console error and no failed request;
no request leaves 127.0.0.1 (plotly.js comes from /static); every chart holds one trace name per mode present in the
data (read from `document.getElementById(div).data`); each figure's CSV link serves the table it plots; the sweeps
list and the sweep page poll the JSON API for progress; a slice chosen in the page's form narrows the figures.
"""

from __future__ import annotations

import csv
import io
from collections.abc import Iterator
from typing import Any
from urllib.parse import urlparse

import httpx
import pytest

from bench_server.core.config import ServerSettings
from bench_server.live import LiveServer
from bench_server.main import create_app
from dashboards.figures import SWEEP_FIGURES
from tests.dashboards.seed import MODES, Seeded

pytestmark = pytest.mark.browser

CHROMIUM_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                 "--disable-background-networking", "--disable-component-update", "--disable-sync"]


@pytest.fixture(scope="module")
def live(seeded_url: str, seeded: Seeded) -> Iterator[LiveServer]:
    app = create_app(ServerSettings(DATABASE_URL=seeded_url, API_TOKEN="browser-test-token-0123456789"))
    with LiveServer(app) as server:
        yield server


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    from playwright.sync_api import sync_playwright

    with sync_playwright() as pw:
        b = pw.chromium.launch(executable_path="/usr/bin/chromium", args=CHROMIUM_ARGS, headless=True)
        yield b
        b.close()


class PageVisit:
    """A page opened with every console message, page error and request recorded."""

    def __init__(self, browser: Any, url: str) -> None:
        self.page = browser.new_page()
        self.console: list[str] = []
        self.requests: list[str] = []
        self.failed: list[str] = []
        self.page.on("console", lambda m: self.console.append(f"{m.type}: {m.text}") if m.type in ("error", "warning") else None)
        self.page.on("pageerror", lambda e: self.console.append(f"pageerror: {e}"))
        self.page.on("request", lambda r: self.requests.append(r.url))
        self.page.on("requestfailed", lambda r: self.failed.append(f"{r.url}: {r.failure}"))
        self.response = self.page.goto(url, wait_until="load")

    def traces(self, div: str) -> list[dict[str, Any]]:
        return self.page.evaluate(
            "(id) => document.getElementById(id).data.map(t => ({name: t.name, meta: t.meta || {}, n: (t.x || []).length}))", div)

    def check_clean(self) -> None:
        assert self.response is not None and self.response.status == 200
        assert self.console == [], self.console
        assert self.failed == [], self.failed
        off_host = [u for u in self.requests if urlparse(u).hostname != "127.0.0.1" and not u.startswith("data:")]
        assert off_host == [], off_host


@pytest.fixture
def visit(browser: Any) -> Iterator[Any]:
    opened: list[PageVisit] = []

    def open_page(url: str) -> PageVisit:
        opened.append(PageVisit(browser, url))
        return opened[-1]

    yield open_page
    for v in opened:
        v.page.close()


def test_sweeps_page(visit: Any, live: LiveServer, seeded: Seeded) -> None:
    v = visit(live.url + "/")
    v.page.wait_for_selector(f'#sweeps tr[data-id="{seeded.sweep_id}"]')
    # the page polls the JSON API for progress
    v.page.wait_for_event("requestfinished", predicate=lambda r: "/api/v1/sweeps?" in r.url, timeout=10_000)
    counts = v.page.inner_text(f'#sweeps tr[data-id="{seeded.sweep_id}"] .counts')
    assert f"/ {seeded.n_points}" in counts and "1 failed" in counts and "1 skipped" in counts
    v.check_clean()


def test_sweep_page_one_trace_per_mode(visit: Any, live: LiveServer, seeded: Seeded) -> None:
    v = visit(f"{live.url}/sweeps/{seeded.sweep_id}")
    assert any(u.endswith("/static/plotly.min.js") for u in v.requests)
    for name in SWEEP_FIGURES:
        traces = v.traces(f"fig-{name}")
        measured = [t for t in traces if t["meta"].get("kind") in ("measured", "best")]
        modes = {t["meta"]["mode"] for t in measured}
        assert {t["name"] for t in measured} == modes, name
        if name == "best_mode":
            assert modes and modes <= set(MODES)
        else:
            assert modes == set(MODES), name
        if name == "comm":
            assert {t["name"] for t in traces if t["meta"].get("kind") == "model"} == {f"{m} (model)" for m in MODES}
    v.check_clean()


@pytest.mark.parametrize("name", list(SWEEP_FIGURES))
def test_sweep_figure_csv(live: LiveServer, seeded: Seeded, name: str) -> None:
    r = httpx.get(f"{live.url}/dash/{seeded.sweep_id}/{name}.csv")
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/csv")
    rows = list(csv.DictReader(io.StringIO(r.text)))
    assert rows and list(rows[0]) == list(SWEEP_FIGURES[name].COLUMNS)
    mode_col = "best_mode" if name == "best_mode" else "mode"
    assert {row[mode_col] for row in rows} <= set(MODES)


def test_sweep_page_csv_links_and_slice(visit: Any, live: LiveServer, seeded: Seeded) -> None:
    v = visit(f"{live.url}/sweeps/{seeded.sweep_id}?H=4&op=gdn")
    links = v.page.eval_on_selector_all("section.figure h2 a", "els => els.map(e => e.getAttribute('href'))")
    assert len(links) == len(SWEEP_FIGURES)
    for link in links:
        assert link.startswith(f"/dash/{seeded.sweep_id}/") and "H=4" in link
        assert httpx.get(live.url + link).status_code == 200
    v.check_clean()


def test_tuning_page(visit: Any, live: LiveServer, seeded: Seeded) -> None:
    v = visit(f"{live.url}/tuning")
    traces = v.traces("fig-tuning")
    assert {t["name"] for t in traces if t["meta"].get("kind") == "trials"} == set(seeded.kernels)
    assert any(t["name"] == "rejected" for t in traces)
    assert v.page.locator("#tuned tbody tr").count() == 4
    v.check_clean()
    r = httpx.get(f"{live.url}/dash/all/tuning.csv")
    assert r.status_code == 200 and len(list(csv.DictReader(io.StringIO(r.text)))) == 2 * 2 * 5


def test_history_page(visit: Any, live: LiveServer, seeded: Seeded) -> None:
    v = visit(f"{live.url}/history")
    traces = v.traces("fig-history")
    assert {t["name"] for t in traces if t["meta"].get("kind") == "history"} == set(seeded.keys)
    assert {t["name"] for t in traces if t["meta"].get("kind") == "verdict"} == {"SLOW", "CHANGED"}
    assert all(t["n"] == 3 for t in traces if t["meta"].get("kind") == "history")  # three nights each
    v.check_clean()
    narrowed = visit(f"{live.url}/history?key=mode%3Dring")
    assert [t["name"] for t in narrowed.traces("fig-history") if t["meta"].get("kind") == "history"] == [seeded.keys[1]]
    narrowed.check_clean()


def test_missing_sweep_page(live: LiveServer) -> None:
    assert httpx.get(f"{live.url}/sweeps/999999").status_code == 404
    assert httpx.get(f"{live.url}/dash/999999/latency.csv").status_code == 404
    assert httpx.get(f"{live.url}/dash/1/nope.csv").status_code == 404


def test_api_docs_page_offline(visit: Any, live: LiveServer) -> None:
    # Swagger UI from the installed package: it renders every route group of the API with nothing off-host
    v = visit(live.url + "/docs")
    v.page.wait_for_selector(".opblock-tag", timeout=15_000)
    tags = {t.strip().lower() for t in v.page.locator(".opblock-tag").all_inner_texts()}
    assert {"sweeps", "results", "configs", "workers", "health"} <= {t.split("\n")[0] for t in tags}, tags
    assert any(u.endswith("/static/swagger/swagger-ui-bundle.js") for u in v.requests)
    v.check_clean()
    assert httpx.get(live.url + "/static/swagger/swagger-ui-bundle.js.map").status_code == 404
