"""The interactive API docs at /docs, served offline: Swagger UI's files come from the installed
`swagger-ui-bundle-v2` package, never from a CDN (FastAPI's default /docs page loads them from jsDelivr).

    /docs                              Swagger UI over /api/v1/openapi.json
    /static/swagger/{file}             swagger-ui-bundle.js, swagger-ui.css, favicon-32x32.png
"""

from __future__ import annotations

from pathlib import Path

from fastapi import APIRouter, HTTPException, Request
from fastapi.openapi.docs import get_swagger_ui_html
from fastapi.responses import FileResponse, HTMLResponse

__all__ = ["SWAGGER_FILES", "router"]

# the only files /docs needs; anything else under the package stays unserved
SWAGGER_FILES = {"swagger-ui-bundle.js": "text/javascript", "swagger-ui.css": "text/css", "favicon-32x32.png": "image/png"}

router = APIRouter(include_in_schema=False)


def _swagger_dir() -> Path:
    from swagger_ui_bundle import swagger_ui_path

    return Path(str(swagger_ui_path))


@router.get("/docs")
def swagger_docs(request: Request) -> HTMLResponse:
    app = request.app
    return get_swagger_ui_html(
        openapi_url=app.openapi_url, title=f"{app.title} API",
        swagger_js_url="/static/swagger/swagger-ui-bundle.js", swagger_css_url="/static/swagger/swagger-ui.css",
        swagger_favicon_url="/static/swagger/favicon-32x32.png",
    )


@router.get("/static/swagger/{name}")
def swagger_file(name: str) -> FileResponse:
    if name not in SWAGGER_FILES:
        raise HTTPException(status_code=404, detail="Not found")
    return FileResponse(_swagger_dir() / name, media_type=SWAGGER_FILES[name], headers={"Cache-Control": "public, max-age=86400"})
