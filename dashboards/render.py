"""Rendering: a figure to an HTML div (plotly.js not included: the page loads it once from /static), a figure's
table to CSV, and where the installed plotly package keeps its plotly.min.js (served locally, never from a CDN).
"""

from __future__ import annotations

import csv
import io
import json
from collections.abc import Iterable, Sequence
from datetime import date, datetime
from pathlib import Path
from typing import Any

import plotly
import plotly.graph_objects as go
import plotly.io as pio

__all__ = ["PLOTLY_CONFIG", "figure_div", "plotly_js_path", "to_csv"]

# no plotly logo link: nothing on the page points off the host
PLOTLY_CONFIG = {"displaylogo": False, "responsive": True, "toImageButtonOptions": {"format": "svg"}}


def plotly_js_path() -> Path:
    """plotly.min.js of the installed plotly package (the same version that built the figures' JSON)."""
    path = Path(plotly.__file__).parent / "package_data" / "plotly.min.js"
    if not path.is_file():
        raise FileNotFoundError(f"plotly.min.js not found in the plotly package at {path}")
    return path


def figure_div(fig: go.Figure, div_id: str, *, keep_title: bool = False) -> str:
    """The figure as a <div id=div_id> plus the script that draws it; expects Plotly loaded by the page.

    The figure's own title is dropped unless `keep_title` (the page puts its title above the div).
    """
    if not keep_title:
        fig = go.Figure(fig).update_layout(title=None, margin={"t": 40})
    return pio.to_html(fig, full_html=False, include_plotlyjs=False, include_mathjax=False, div_id=div_id,
                       config=PLOTLY_CONFIG, default_height=fig.layout.height or 450)


def _cell(value: Any) -> Any:
    if value is None:
        return ""
    if isinstance(value, (dict, list, tuple)):
        return json.dumps(value, sort_keys=True, default=str)
    if isinstance(value, float):
        return repr(value)
    if isinstance(value, (datetime, date)):
        return value.isoformat()
    return value


def to_csv(table: Iterable[dict[str, Any]], columns: Sequence[str]) -> str:
    """CSV with a header row; nested values (dicts, lists) as JSON, None as an empty cell."""
    buf = io.StringIO()
    writer = csv.writer(buf, lineterminator="\n")
    writer.writerow(columns)
    for row in table:
        writer.writerow([_cell(row.get(c)) for c in columns])
    return buf.getvalue()
