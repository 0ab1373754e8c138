"""Screenshots of the main dashboard pages of a running cpbench server, in headless Chromium (Playwright).

    python benchmarks/screens.py --url http://127.0.0.1:8000 --sweep 12 --out docs/screens

Writes PNGs: `index.png` (the sweeps list), `sweep-<id>.png` (the whole sweep page), `sweep-<id>-<figure>.png` (each
figure's section), `tuning.png`, `history.png`. Waits until every plotly chart has drawn. `--query` adds a slice to the
sweep page (e.g. `op=kda&direction=fwd`); `--chromium` points at the browser (default /usr/bin/chromium, else
Playwright's own). Exits 1 with one line when the server or the sweep cannot be reached.
"""

from __future__ import annotations

import argparse
import shutil
import sys
from pathlib import Path

CHROMIUM_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                 "--disable-background-networking", "--disable-component-update", "--disable-sync"]
WAIT_PLOTS = "() => [...document.querySelectorAll('.js-plotly-plot')].every(el => el._fullLayout)"


def shoot(url: str, sweep: int, out: Path, *, query: str = "", chromium: str | None = None, width: int = 1500) -> list[Path]:
    """Save the screenshots; returns their paths."""
    from playwright.sync_api import sync_playwright

    out.mkdir(parents=True, exist_ok=True)
    saved: list[Path] = []
    url = url.rstrip("/")
    pages = [("index", "/"), (f"sweep-{sweep}", f"/sweeps/{sweep}" + (f"?{query}" if query else "")),
             ("tuning", "/tuning"), ("history", "/history")]
    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=chromium, args=CHROMIUM_ARGS, headless=True)
        page = browser.new_page(viewport={"width": width, "height": 900}, device_scale_factor=1)
        for name, path in pages:
            response = page.goto(url + path, wait_until="load")
            if response is None or response.status != 200:
                raise SystemExit(f"error: {url + path} answered {None if response is None else response.status}")
            page.wait_for_function(WAIT_PLOTS, timeout=30_000)
            saved.append(out / f"{name}.png")
            page.screenshot(path=saved[-1], full_page=True)
            if name.startswith("sweep-"):
                for section in page.locator("section.figure").all():
                    fig = (section.get_attribute("id") or "figure").removeprefix("section-")
                    saved.append(out / f"{name}-{fig}.png")
                    section.screenshot(path=saved[-1])
        browser.close()
    return saved


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--url", default="http://127.0.0.1:8000", help="the server (default %(default)s)")
    ap.add_argument("--sweep", type=int, required=True, help="the sweep id to show")
    ap.add_argument("--out", type=Path, default=Path("screens"), help="output folder (default %(default)s)")
    ap.add_argument("--query", default="", help="slice of the sweep page, e.g. op=kda&direction=fwd")
    ap.add_argument("--chromium", default="/usr/bin/chromium" if shutil.which("/usr/bin/chromium") else None)
    ap.add_argument("--width", type=int, default=1500, help="viewport width in pixels")
    args = ap.parse_args(argv)
    try:
        saved = shoot(args.url, args.sweep, args.out, query=args.query, chromium=args.chromium, width=args.width)
    except SystemExit:
        raise
    except Exception as exc:  # a user-facing script: one line, no traceback
        print(f"error: {type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}", file=sys.stderr)
        return 1
    for p in saved:
        print(p)
    return 0


if __name__ == "__main__":
    sys.exit(main())
