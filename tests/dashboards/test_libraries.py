"""The sweep page answers (mode, library) together, read over HTTP from the real app (uvicorn on 127.0.0.1) on a store
seeded with four backends (`tests.dashboards.seed.seed_libraries`: ours as triton, fla, fla_dispatch, flash_qla).

Scenarios: the mode map's winner names its backend with its speedup ("flash_qla · warmup_correct 2.08×"); the backend
selector offers "all" and each backend, and one backend alone keeps plain mode names; the "best of each library"
figure draws one column per library (ours first) and per shape (T, W) each library's fastest run with its ratio to
the fastest library (the heatmap's z), an unreliable best as "noisy" that is never the reference, and a library
with only skipped points there as "skipped" with its reason; the skipped points are listed per backend and reason;
the figure's CSV is the table it draws.
"""

from __future__ import annotations

import csv
import io
import json
import re
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from bench_server.core.config import ServerSettings
from bench_server.live import LiveServer
from bench_server.main import create_app
from dashboards.figures import libraries
from tests.dashboards.seed import LIB_MS, LIB_NOISY, LIB_SKIPS, LIB_TS, UNRELIABLE_WHY, Libraries, Seeded, seed_libraries

TOKEN = "libraries-test-token-0123456789"
LIBS = ["ours", "fla", "fla_dispatch", "flash_qla"]
NOISY_T = LIB_NOISY[3]  # the T of the unreliable fla_dispatch run


@pytest.fixture(scope="module")
def libs(seeded_url: str, seeded: Seeded) -> Libraries:
    return seed_libraries(seeded_url)


@pytest.fixture(scope="module")
def client(seeded_url: str, libs: Libraries) -> Iterator[httpx.Client]:
    app = create_app(ServerSettings(DATABASE_URL=seeded_url, API_TOKEN=TOKEN))
    with LiveServer(app) as live, httpx.Client(base_url=live.url, timeout=60) as c:
        yield c


def page(client: httpx.Client, sweep_id: int, **query: str) -> str:
    r = client.get(f"/sweeps/{sweep_id}", params=query)
    assert r.status_code == 200, r.text[:500]
    return r.text


def figure(html: str, div: str) -> list[dict[str, Any]]:
    """The traces a page draws in `div` (plotly's newPlot call)."""
    m = re.search(rf'Plotly\.newPlot\(\s*"{div}",\s*(\[.*?\]),\s*(\{{.*?\}}),\s*\{{"displaylogo"', html, re.S)
    assert m, f"no figure {div}"
    return json.loads(m.group(1))


def cells(traces: list[dict[str, Any]], kind: str) -> dict[tuple[str, str], tuple[str, Any, Any]]:
    """{(row, column): (text, z, point id)} of every drawn cell of the traces of `kind`."""
    out = {}
    for t in traces:
        if (t.get("meta") or {}).get("kind") != kind:
            continue
        for i, y in enumerate(t["y"]):
            for j, x in enumerate(t["x"]):
                if t["text"][i][j]:
                    out[(y, x)] = (t["text"][i][j], t["z"][i][j], t["customdata"][i][j][1])
    return out


def ms(backend: str, mode: str, W: int, T: int) -> float:
    return LIB_MS[(backend, mode, W)][LIB_TS.index(T)]


def test_mode_map_winner_names_library_and_mode_with_its_speedup(client: httpx.Client, libs: Libraries) -> None:
    html = page(client, libs.sweep_id)
    best = [t for t in figure(html, "fig-best_mode") if t["meta"]["kind"] == "best"]
    won = {(y, x): (t, t["text"][i][j]) for t in best for i, y in enumerate(t["y"]) for j, x in enumerate(t["x"])
           if t["text"][i][j]}  # fmt: skip
    for T in LIB_TS:
        trace, text = won[(f"T={T}", "W=1")]
        speedup = ms("flash_qla", "none", 1, T) / ms("flash_qla", "warmup_correct", 1, T)  # over its own none
        assert text.startswith(f"<b>flash_qla · warmup_correct</b> {speedup:.2f}×"), text
        assert trace["name"] == "warmup_correct · flash_qla" and trace["meta"]["backend"] == "flash_qla"
    assert won[("T=8192", "W=1")][1].startswith("<b>flash_qla · warmup_correct</b> 2.08×")
    # the unreliable fla_dispatch run at 64K is slower than the winner: it is named nowhere as a winner
    assert all("fla_dispatch" not in text.split("<br>")[0] for _, text in won.values())


def test_backend_selector_offers_each_backend_and_one_alone_keeps_plain_names(client: httpx.Client, libs: Libraries) -> None:
    html = page(client, libs.sweep_id)
    select = re.search(r'<select name="backend"[^>]*>(.*?)</select>', html, re.S)
    assert select is not None
    assert re.findall(r'<option value="([^"]+)"', select.group(1)) == ["all", "fla", "fla_dispatch", "flash_qla", "triton"]
    assert '<option value="all" selected>' in select.group(1)
    alone = page(client, libs.sweep_id, backend="flash_qla")
    best = [t for t in figure(alone, "fig-best_mode") if t["meta"]["kind"] == "best"]
    assert {t["name"] for t in best} == {"warmup_correct"}
    assert all(text.startswith("<b>warmup_correct</b>") for t in best for line in t["text"] for text in line if text)
    lib = figure(alone, "fig-libraries")
    assert {x for t in lib for x in t["x"]} == {"flash_qla"}


def test_best_of_each_library_row_says_how_far_apart_they_are(client: httpx.Client, libs: Libraries) -> None:
    traces = figure(page(client, libs.sweep_id), "fig-libraries")
    assert all(t["x"] == LIBS for t in traces)
    drawn = cells(traces, "library")
    for T in LIB_TS:
        row = f"T={T // 1024}K · W=1"
        best = {"ours": ms("triton", "warmup_correct", 1, T), "fla": ms("fla", "warmup_correct", 1, T),
                "flash_qla": ms("flash_qla", "warmup_correct", 1, T)}  # fmt: skip
        if T != NOISY_T:
            best["fla_dispatch"] = ms("fla_dispatch", "warmup_correct", 1, T)
        fastest = min(best.values())
        assert fastest == best["flash_qla"]
        for lib, t in best.items():
            text, z, pid = drawn[(row, lib)]
            assert z == pytest.approx(min(t / fastest, libraries.RATIO_CAP)), (row, lib)
            backend = "triton" if lib == "ours" else lib
            assert pid == libs.ids[(backend, "warmup_correct", 1, T)]
            assert (lib == "ours") == text.startswith("<b>triton · warmup_correct</b>"), text
            assert ("fastest" in text) == (lib == "flash_qla") and f"{t:.3g} ms" in text
            if lib != "flash_qla":
                assert f"{t / fastest:.2f}× slower" in text
    # the unreliable fastest fla_dispatch run at 64K: noisy, and the others' ratios stay over flash_qla's time
    noisy = cells(traces, "noisy")
    assert set(noisy) == {("T=64K · W=1", "fla_dispatch")}
    text, _, pid = noisy[("T=64K · W=1", "fla_dispatch")]
    assert text.startswith("<b>noisy</b>") and pid == libs.ids[("fla_dispatch", "warmup_correct", 1, 65536)]
    hover = next(t for t in traces if t["meta"]["kind"] == "noisy")["customdata"]
    assert any(UNRELIABLE_WHY in c[0] for line in hover for c in line)
    # W=2: ours fastest, FLA behind; FlashQLA and FLA as dispatched skipped, with their own reasons
    for T in LIB_TS:
        row = f"T={T // 1024}K · W=2"
        assert "fastest" in drawn[(row, "ours")][0]
        assert drawn[(row, "fla")][1] == pytest.approx(ms("fla", "true_cp", 2, T) / ms("triton", "true_cp", 2, T))
        skipped = cells(traces, "skipped")
        for lib in ("flash_qla", "fla_dispatch"):
            text, z, pid = skipped[(row, lib)]
            reason = LIB_SKIPS[(lib, "true_cp", 2, "bfloat16")]
            assert text.startswith("<b>skipped</b><br>") and text.replace("<br>", " ")[15:].startswith(reason[:30])
            assert pid is None and (row, lib) not in drawn
        hovers = [c[0] for t in traces if t["meta"]["kind"] == "skipped" for line in t["customdata"] for c in line]
        assert all(any(reason in h for h in hovers) for (_, m, *_), reason in LIB_SKIPS.items() if m == "true_cp")


def test_skipped_points_list_their_reasons_per_backend(client: httpx.Client, libs: Libraries) -> None:
    html = page(client, libs.sweep_id)
    section = re.search(r'<section id="skipped">(.*?)</section>', html, re.S)
    assert section is not None
    summaries = re.findall(r'<b>(\d+) points?</b> of <span class="backend">([^<]+)</span>: <span class="reason">([^<]+)</span>',
                           section.group(1))  # fmt: skip
    want = {(b, reason.replace("'", "&#39;")): len(LIB_TS) for (b, *_), reason in LIB_SKIPS.items()}
    assert {(b, r): int(n) for n, b, r in summaries} == want
    # the float32 slice: FlashQLA's dtype reason where its column is
    f32 = figure(page(client, libs.sweep_id, dtype="float32"), "fig-libraries")
    text, _, _ = cells(f32, "skipped")[("T=8K · W=1", "flash_qla")]
    assert (
        "bfloat16 and float16 only" in text.replace("<br>", " ")
        and "fastest" in cells(f32, "library")[("T=8K · W=1", "ours")][0]
    )


def test_library_csv_is_the_table_drawn(client: httpx.Client, libs: Libraries) -> None:
    r = client.get(f"/dash/{libs.sweep_id}/libraries.csv")
    assert r.status_code == 200
    table = list(csv.DictReader(io.StringIO(r.text)))
    assert tuple(table[0]) == libraries.COLUMNS
    rows = {(int(t["T"]), int(t["W"]), t["library"]): t for t in table}
    assert rows[(8192, 1, "flash_qla")]["fastest"] == "True" and rows[(8192, 1, "flash_qla")]["best_mode"] == "warmup_correct"
    assert float(rows[(8192, 1, "fla")]["vs_fastest"]) == pytest.approx(0.50 / 0.13)
    assert rows[(65536, 1, "fla_dispatch")]["kind"] == "noisy" and rows[(65536, 1, "fla_dispatch")]["vs_fastest"] == ""
    assert rows[(8192, 2, "flash_qla")]["kind"] == "skipped"
