"""The dashboard pages in headless Chromium (Playwright driving /usr/bin/chromium) against a live app on a seeded
store.

Scenarios: each page (sweeps list, one sweep, tuning, history) loads with no console error and no failed request;
no request leaves 127.0.0.1 (plotly.js comes from /static); every chart of a sweep with W in {1, 2, 4} and two lb
values is non-empty, holds one trace name per mode present in the data and only its own points in each facet (read
from `document.getElementById(div).data` and `.layout`); each figure's CSV link serves the table it plots; the sweeps
list and the sweep page poll the JSON API for progress; a slice chosen in the page's form narrows the figures; a sweep
whose points all failed shows "failed" with its traceback readable; the sweeps list filters by name, tag and status
and collapses a regression run's sweeps into one row.
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
from dashboards import data
from dashboards.figures import SWEEP_FIGURES
from db.session import get_sessionmaker
from tests.dashboards.seed import FAILED_ERROR, MODES, Extras, Seeded, seed_index_extras
from tests.dashboards.test_facets import belongs, facet_of

pytestmark = pytest.mark.browser

CHROMIUM_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                 "--disable-background-networking", "--disable-component-update", "--disable-sync"]


@pytest.fixture(scope="module")
def extras(seeded_url: str, seeded: Seeded) -> Extras:
    return seed_index_extras(seeded_url)


@pytest.fixture(scope="module")
def live(seeded_url: str, seeded: Seeded, extras: Extras) -> Iterator[LiveServer]:
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

    def figure_json(self, div: str) -> dict[str, Any]:
        return self.page.evaluate("(id) => { const el = document.getElementById(id);"
                                  " return JSON.parse(JSON.stringify({data: el.data, layout: el.layout})); }", div)

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
        if name == "libraries":  # per library, not per mode: the seed's only backend (torch) is "ours"
            assert traces and {t["meta"]["kind"] for t in traces} <= {"library", "skipped", "failed"}
            assert all(t["n"] == 1 for t in traces)  # one library column
            continue
        measured = [t for t in traces if t["meta"].get("kind") in ("measured", "best")]
        modes = {t["meta"]["mode"] for t in measured}
        assert {t["name"] for t in measured} == modes, name
        if name == "best_mode":
            assert modes and modes <= set(MODES)
        elif name == "scaling":  # `none` is the baseline of every speedup
            assert modes == set(MODES) - {"none"}, name
        elif name == "predicted":  # the scaling model leaves warmup_correct out
            assert modes == set(MODES) - {"warmup_correct"}, name
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
    mode_col = "best_mode" if name in ("best_mode", "libraries") else "mode"
    assert {row[mode_col] for row in rows if name != "libraries" or row["kind"] not in ("skipped", "failed")} <= set(MODES)


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


def test_sweep_figures_non_empty_and_faceted(visit: Any, live: LiveServer, seeded: Seeded, seeded_url: str) -> None:
    """W in {1, 2, 4}, lb in {-1, -4}: every figure draws points, and every point sits in its own facet."""
    with get_sessionmaker(seeded_url)() as session:
        by_id = {str(r["id"]): r for r in data.sweep_rows(session, seeded.sweep_id, limit=1000)}
    assert {r["W"] for r in by_id.values()} >= {1, 2, 4} and len({r["lb"] for r in by_id.values()}) == 2
    v = visit(f"{live.url}/sweeps/{seeded.sweep_id}")
    for name in SWEEP_FIGURES:
        fig = v.figure_json(f"fig-{name}")
        points = 0
        for trace in fig["data"]:
            kind = (trace.get("meta") or {}).get("kind")
            facet = facet_of(fig, trace)
            if trace["type"] == "heatmap":
                cells = [c[1] for line in trace["customdata"] for c in line if c[1] is not None]
                assert all(belongs(by_id[str(pid)], facet) for pid in cells), name
                points += len(cells)
            elif kind == "measured":
                points += len(trace["x"])
                if trace.get("ids"):
                    assert all(belongs(by_id[pid], facet) for pid in trace["ids"]), (name, facet)
            elif kind == "reference":
                assert all(by_id[pid]["mode"] == "none" and by_id[pid]["W"] == 1 for pid in trace["ids"])
        assert points > 0, f"{name} is empty"
    v.check_clean()


def test_failed_sweep_page(visit: Any, live: LiveServer, extras: Extras) -> None:
    v = visit(f"{live.url}/sweeps/{extras.failed_id}")
    assert v.page.inner_text("#status") == "failed"
    pre = v.page.inner_text("#errors pre.error")
    assert pre == FAILED_ERROR  # the whole traceback, its line breaks kept
    assert "2 points" in v.page.inner_text("#errors summary") and "0 active drivers" in v.page.inner_text("#errors summary")
    # the figures say why they are empty instead of "no data yet"
    notes = v.page.evaluate("() => [...document.querySelectorAll('section.figure .js-plotly-plot')]"
                            ".map(el => (el.layout.annotations || []).map(a => a.text).join(' '))")
    assert notes and all("no point finished: 2 failed" in n for n in notes)
    v.check_clean()


def test_sweeps_list_filters_and_collapses_runs(visit: Any, live: LiveServer, seeded: Seeded, extras: Extras) -> None:
    v = visit(live.url + "/")
    run_rows = v.page.locator("#sweeps tr[data-run]")
    assert run_rows.count() == 1  # the run's four sweeps in one row
    assert run_rows.first.get_attribute("data-members") == ",".join(str(i) for i in reversed(extras.run_ids))
    assert v.page.locator("#sweeps tr[data-id]").count() == 1 + 1 + 3 + 1  # cp-demo, failed, 3 nightlies, the run
    assert v.page.inner_text(f'#sweeps tr[data-id="{extras.failed_id}"] .status') == "failed"
    v.check_clean()
    failed = visit(live.url + "/?status=failed")
    ids = failed.page.eval_on_selector_all("#sweeps tr[data-id]", "els => els.map(e => +e.dataset.id)")
    assert ids == [extras.failed_id, seeded.sweep_id]  # cp-demo has one failed point: done with failures
    assert failed.page.inner_text(f'#sweeps tr[data-id="{seeded.sweep_id}"] .status') == "done with failures"
    by_tag = visit(live.url + "/?tag=regress")
    assert by_tag.page.locator("#sweeps tr[data-id]").count() == 1 and by_tag.page.locator("#sweeps tr[data-run]").count() == 1
    by_name = visit(live.url + "/?name=CP-DEMO")
    assert by_name.page.eval_on_selector_all("#sweeps tr[data-id]", "els => els.map(e => +e.dataset.id)") == [seeded.sweep_id]
    none = visit(live.url + "/?name=no-such-sweep")
    assert "No sweep matches" in none.page.inner_text("main")
    for page in (failed, by_tag, by_name, none):
        page.check_clean()
