"""``GET /docs``: Swagger UI for ``/openapi.json``, served from local files, never from a CDN.

Owns: the page and its assets under ``/docs/assets/`` (only the few files the page loads). The
assets come from the ``swagger-ui-bundle`` package (``swagger_assets``); without it ``/docs``
is a 404 that says what to install, and the API itself is unaffected. A server that needs keys
needs one for these paths too (the page is not one of the health probes).
"""

from __future__ import annotations

from pathlib import Path

from fastapi import APIRouter
from fastapi.openapi.docs import get_swagger_ui_html
from fastapi.responses import FileResponse, HTMLResponse
from starlette.exceptions import HTTPException

DOCS_PATH = "/docs"
ASSETS_PATH = "/docs/assets"
JS, CSS, ICON = "swagger-ui-bundle.js", "swagger-ui.css", "favicon-32x32.png"
_MEDIA_TYPES = {JS: "text/javascript", CSS: "text/css", ICON: "image/png"}
MISSING = "the API documentation page needs the swagger-ui-bundle package; /openapi.json has the API"


def swagger_assets() -> Path | None:
    """The folder of Swagger UI's files in the installed ``swagger-ui-bundle``, if any."""
    try:
        import swagger_ui_bundle  # type: ignore[import-not-found, unused-ignore]
    except ImportError:
        return None
    return Path(str(swagger_ui_bundle.swagger_ui_path))


def docs_router(assets: Path | None, openapi_url: str, title: str) -> APIRouter:
    """The page and its assets, from ``assets`` (None: the 404 naming the missing package)."""
    router = APIRouter(include_in_schema=False)

    @router.get(DOCS_PATH)
    async def docs_page() -> HTMLResponse:
        if assets is None:
            raise HTTPException(404, MISSING)
        return get_swagger_ui_html(
            openapi_url=openapi_url,
            title=f"{title} - API",
            swagger_js_url=f"{ASSETS_PATH}/{JS}",
            swagger_css_url=f"{ASSETS_PATH}/{CSS}",
            swagger_favicon_url=f"{ASSETS_PATH}/{ICON}",
        )

    @router.get(ASSETS_PATH + "/{name}")
    async def docs_asset(name: str) -> FileResponse:
        # Only the page's own files: the name is a key, never a path into the folder.
        if assets is None or name not in _MEDIA_TYPES or not (assets / name).is_file():
            raise HTTPException(404, "Not Found")
        return FileResponse(assets / name, media_type=_MEDIA_TYPES[name])

    return router
