"""The dashboard pages' HTML through the app (no browser): what each page draws from a seeded store.

Scenarios: a fwd+bwd sweep whose `none` is unreliable (stopped on timeout with n=3) shows it in an "Unreliable
measurements" table with its reason and spread, its mode map says "noisy" (no speedup over that `none`), its skipped
points are listed under their reasons (not only counted) and its per-gradient errors are a table; the sweeps index
counts its unreliable points; a second request
of the same page is served from the per-revision cache and a new result invalidates it; the history page says when
it caps its keys; the browser routes' 404 and 422 are HTML pages while the API's stay JSON.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from datetime import datetime, timezone

import pytest
from fastapi.testclient import TestClient

from bench_server import pages
from bench_server.core.config import ServerSettings
from bench_server.main import create_app
from dashboards import data
from db import crud
from db.models import Point
from db.session import session_scope
from tests.dashboards.seed import (
    FACTS,
    UNRELIABLE_WHY,
    PageExtras,
    Seeded,
    _mark,
    _measure,
    page_figure,
    point,
    seed_page_extras,
)


@pytest.fixture(scope="module")
def extras(seeded_url: str, seeded: Seeded) -> PageExtras:
    return seed_page_extras(seeded_url)


@pytest.fixture(scope="module")
def client(seeded_url: str, extras: PageExtras) -> Iterator[TestClient]:
    with TestClient(create_app(ServerSettings(DATABASE_URL=seeded_url, API_TOKEN="pages-test-token-0123456789"))) as c:
        yield c


def _section(html: str, section_id: str) -> str:
    m = re.search(rf'<section id="{section_id}">(.*?)</section>', html, re.S)
    assert m, f"no section {section_id}"
    return m.group(1)


def test_sweep_page_flags_unreliable_and_lists_skip_reasons_and_gradients(client: TestClient, extras: PageExtras) -> None:
    r = client.get(f"/sweeps/{extras.sweep_id}")
    assert r.status_code == 200
    html = r.text
    table = _section(html, "unreliable")
    assert "Unreliable measurements (1)" in table and UNRELIABLE_WHY.replace("<", "&lt;") in table
    assert "0.76–139.5" in table and "timeout" in table
    skipped = _section(html, "skipped")
    assert "Skipped points (3)" in skipped
    for (backend, reason), n in extras.skip_reasons.items():
        summary = rf"<b>{n} points?</b> of <span class=\"backend\">{backend}</span>: <span class=\"reason\">"
        assert re.search(summary + re.escape(reason) + "</span>", skipped)
    assert skipped.count("point 2 (headwise") == 1 and "point 4 (ring · fla" in skipped
    grads = _section(html, "grad-errors")
    assert re.findall(r"<th>([^<]+)</th>", grads) == ["point", *extras.grads, "max (gate)"]
    row = re.search(r"<tr><td>point 1 \(true_cp.*?</tr>", grads, re.S)
    drawn = re.findall(r"<td>([0-9.e+-]+)</td>", row.group(0)) if row else []
    assert drawn == [f"{v:.3e}" for v in extras.grads.values()] + ["4.500e-03"]  # and the gate's max (dg)
    mode_map = page_figure(html, "fig-best_mode")
    noisy = [t for t in mode_map["data"] if t["meta"]["kind"] == "noisy"]
    cells = [text for t in noisy for line in t["text"] for text in line if text]
    # W=1: the fastest run is the unreliable none; W=2: true_cp over that none: no 16× headline either way
    assert sorted(cells) == ["<b>noisy</b><br>baseline unreliable", "<b>noisy</b><br>winner unreliable"]
    assert not [t for t in mode_map["data"] if t["meta"]["kind"] == "best" and t["meta"]["mode"] == "true_cp"]
    scaling = page_figure(html, "fig-scaling")
    assert scaling["layout"]["annotations"][0]["text"].startswith("no reliable `none` baseline")


def test_api_rows_carry_the_flag(client: TestClient, extras: PageExtras) -> None:
    rows = client.get("/api/v1/results", params={"sweep": extras.sweep_id}).json()["data"]
    assert [(r["idx"], r["unreliable"]) for r in rows if r["status"] == "done"] == [(0, UNRELIABLE_WHY), (1, None)]


def test_index_counts_each_sweeps_unreliable_points(client: TestClient, extras: PageExtras) -> None:
    html = client.get("/").text
    assert '<th title="done points whose stop rule did not converge">unreliable</th>' in html
    cells = dict(re.findall(r'<tr data-id="(\d+)".*?<td class="unreliable">(\d+)</td>', html, re.S))
    assert cells[str(extras.sweep_id)] == "1"  # its `none` point: done, stopped on timeout
    assert client.get(f"/api/v1/sweeps/{extras.sweep_id}").json()["progress"]["unreliable"] == 1  # what the page polls


def test_sweep_page_is_cached_per_revision(
    client: TestClient, seeded_url: str, extras: PageExtras, monkeypatch: pytest.MonkeyPatch
) -> None:
    pages.SWEEP_PAGES.clear()
    built: list[int] = []
    real = pages._sweep_content
    monkeypatch.setattr(pages, "_sweep_content", lambda *a, **k: built.append(1) or real(*a, **k))
    first = client.get(f"/sweeps/{extras.sweep_id}").text
    assert client.get(f"/sweeps/{extras.sweep_id}").text == first and len(built) == 1
    client.get(f"/sweeps/{extras.sweep_id}?op=gdn")
    assert len(built) == 2  # another query string: another entry
    with session_scope(seeded_url) as s:  # a point changes status: a new revision, recomputed
        pt = s.query(Point).filter(Point.sweep_id == extras.sweep_id, Point.idx == 4).one()
        pt.status = "queued"
    client.get(f"/sweeps/{extras.sweep_id}")
    assert len(built) == 3
    with session_scope(seeded_url) as s:
        pt = s.query(Point).filter(Point.sweep_id == extras.sweep_id, Point.idx == 4).one()
        pt.status = "skipped"


def test_history_says_when_it_caps(client: TestClient, seeded_url: str) -> None:
    assert 'id="capped"' not in client.get("/history").text
    with session_scope(seeded_url) as s:
        env = crud.get_or_create_environment(s, facts=FACTS)
        s.flush()
        specs = [point(i, mode="ring", W=2, T=256 * (i + 1), B=1, lb=-2.0) for i in range(data.HISTORY_KEYS + 1)]
        sweep = crud.create_sweep(s, name="nightly-wide", tags=["nightly"], spec={"name": "nightly"}, points=specs)
        import random

        for pt in _mark(s, sweep, {}, datetime.now(timezone.utc)):
            _measure(s, pt.id, specs[pt.idx], env.id, 1.0 + random.random())
    html = client.get("/history").text
    assert f"Showing the first {data.HISTORY_KEYS} keys only" in html and "capped at 12" in html
    assert 'id="capped"' not in client.get("/history?key=nosuchkey").text


@pytest.mark.parametrize(
    ("url", "status", "says"),
    [
        ("/sweeps/999999", 404, "Sweep not found"),
        ("/sweeps/abc", 422, "sweep_id: Input should be a valid integer"),
        ("/sweeps/0", 422, "sweep_id: Input should be greater than or equal to 1"),
        ("/tuning?sweep=x", 422, "sweep: Input should be a valid integer"),
        ("/nosuch/page", 404, "no page at /nosuch/page"),
        ("/dash/1/nosuch.csv", 404, "no figure &#39;nosuch&#39;"),
    ],
)
def test_browser_errors_are_html(client: TestClient, url: str, status: int, says: str) -> None:
    r = client.get(url)
    assert r.status_code == status and r.headers["content-type"].startswith("text/html")
    assert f'<h1 id="error-status">{status} · ' in r.text and says in r.text


@pytest.mark.parametrize(
    ("url", "status"), [("/api/v1/sweeps/999999", 404), ("/api/v1/sweeps/abc", 422), ("/api/v1/nosuch", 404)]
)
def test_api_errors_stay_json(client: TestClient, url: str, status: int) -> None:
    r = client.get(url)
    assert r.status_code == status and r.headers["content-type"] == "application/json"
    assert "detail" in r.json()


def test_history_flags_an_unreliable_night(client: TestClient, seeded_url: str, seeded: Seeded) -> None:
    from db.models import Measurement

    with session_scope(seeded_url) as s:
        pt = s.query(Point).filter(Point.sweep_id == seeded.nightly_ids[1], Point.key == seeded.keys[0]).one()
        s.query(Measurement).filter(Measurement.point_id == pt.id).one().unreliable = UNRELIABLE_WHY
    fig = page_figure(client.get("/history").text, "fig-history")
    line = next(t for t in fig["data"] if t["meta"]["kind"] == "history" and t["name"] == seeded.keys[0])
    assert line["marker"]["symbol"] == ["circle", "circle-open", "circle"]  # the second night, open
    assert [bool(c[3]) for c in line["customdata"]] == [False, True, False] and UNRELIABLE_WHY in line["customdata"][1][3]
    csv_text = client.get("/dash/all/history.csv").text
    assert csv_text.splitlines()[0].endswith(",unreliable") and csv_text.count(UNRELIABLE_WHY) == 1
