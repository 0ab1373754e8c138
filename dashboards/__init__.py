"""Dashboards: queries over the store (`data`), pure plotly figures (`figures`), the communication cost model
(`cost_model`), rendering to HTML divs and CSV (`render`) and the jinja2 page templates (`templates/`).

Depends on `db` only; the app in `bench_server` serves the pages, and plotly.js from the installed plotly package.
"""
