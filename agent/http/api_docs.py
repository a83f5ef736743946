"""`/docs` (Swagger UI) and `/redoc` with their scripts and styles served by the app, not by a CDN.

FastAPI's "self-hosting JavaScript and CSS for docs" recipe; the assets come from the ``fastapi-offline``
package (Swagger UI's bundle and CSS, ReDoc's standalone bundle), so the pages work without internet.
"""

from __future__ import annotations

from pathlib import Path

import fastapi_offline
from fastapi import FastAPI, Request
from fastapi.openapi.docs import get_redoc_html, get_swagger_ui_html, get_swagger_ui_oauth2_redirect_html
from fastapi.responses import HTMLResponse
from fastapi.staticfiles import StaticFiles

STATIC_URL = "/static/api-docs"
ASSETS = Path(fastapi_offline.__file__).parent / "static"
#: The pages reach the service only: their own scripts (and the inline start-up script FastAPI writes), the
#: OpenAPI document, and images from here or inline. ReDoc's footer logo points at a CDN: blocked, not fetched.
CSP = (
    "default-src 'none'; script-src 'self' 'unsafe-inline'; style-src 'self' 'unsafe-inline'; "
    "img-src 'self' data:; font-src 'self' data:; connect-src 'self'; worker-src 'self' blob:; "
    "frame-ancestors 'none'; base-uri 'none'; form-action 'self'"
)


def _confined(page: HTMLResponse) -> HTMLResponse:
    page.headers["Content-Security-Policy"] = CSP
    return page


def install(app: FastAPI) -> None:
    """Add /docs and /redoc to an app created with ``docs_url=None, redoc_url=None``."""
    app.mount(STATIC_URL, StaticFiles(directory=ASSETS), name="api-docs-assets")
    openapi_url = app.openapi_url or "/openapi.json"
    oauth2_redirect = app.swagger_ui_oauth2_redirect_url or "/docs/oauth2-redirect"

    @app.get("/docs", include_in_schema=False)
    async def swagger_ui(request: Request) -> HTMLResponse:
        root = request.scope.get("root_path", "")
        return _confined(
            get_swagger_ui_html(
                openapi_url=f"{root}{openapi_url}",
                title=f"{app.title} - API",
                oauth2_redirect_url=f"{root}{oauth2_redirect}",
                swagger_js_url=f"{root}{STATIC_URL}/swagger-ui-bundle.js",
                swagger_css_url=f"{root}{STATIC_URL}/swagger-ui.css",
                swagger_favicon_url=f"{root}{STATIC_URL}/favicon.png",
            )
        )

    @app.get(oauth2_redirect, include_in_schema=False)
    async def swagger_ui_redirect() -> HTMLResponse:
        return get_swagger_ui_oauth2_redirect_html()

    @app.get("/redoc", include_in_schema=False)
    async def redoc(request: Request) -> HTMLResponse:
        root = request.scope.get("root_path", "")
        return _confined(
            get_redoc_html(
                openapi_url=f"{root}{openapi_url}",
                title=f"{app.title} - API reference",
                redoc_js_url=f"{root}{STATIC_URL}/redoc.standalone.js",
                redoc_favicon_url=f"{root}{STATIC_URL}/favicon.png",
                with_google_fonts=False,
            )
        )
