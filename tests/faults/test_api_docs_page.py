"""/docs, which the live page's footer links, runs nothing from another host on the sidecar's origin (where the
page keeps the token in sessionStorage): it is the sidecar's own page under the live page's CSP, and it works
with no network at all. FastAPI's Swagger UI and ReDoc (scripts from a CDN) are not served."""

from __future__ import annotations

import re

import httpx
import pytest

from gatherwise.sidecar.api.routes_page import CSP
from tests._sidecar import wait_for
from tests.faults._faults import sidecar_with_token
from tests.sidecar.api.test_page_browser import CHROMIUM_ARGS, browser_or_skip

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]


def test_api_docs_load_nothing_from_elsewhere(shm_dir):
    proc, url, api = sidecar_with_token(shm_dir)
    try:
        docs = api.get("/docs")
        assert docs.status_code == 200 and docs.headers["content-security-policy"] == CSP, docs.headers
        sources = re.findall(r'(?:src|href)="([^"]*)"', docs.text)
        assert sources and all(s.startswith("/") and not s.startswith("//") for s in sources), sources
        for source in sources:
            assert api.get(source).status_code == 200, source
        assert api.get("/page/docs.js").headers["content-security-policy"] == CSP
        assert api.get("/redoc").status_code == 404 and api.get("/docs/oauth2-redirect").status_code == 404

        chromium = browser_or_skip()
        from playwright.sync_api import expect, sync_playwright

        with sync_playwright() as pw:
            browser = pw.chromium.launch(executable_path=chromium, args=CHROMIUM_ARGS)
            try:
                page = browser.new_page()
                elsewhere: list[str] = []
                errors: list[str] = []
                page.on("request", lambda r: None if r.url.startswith(url) else elsewhere.append(r.url))
                page.on("console", lambda m: errors.append(m.text) if m.type == "error" else None)
                page.on("pageerror", lambda e: errors.append(str(e)))
                page.goto(f"{url}/")
                page.click('footer a[href="/docs"]')
                expect(page.locator('[data-operation="PUT /v1/mode"]')).to_contain_text("409")
                expect(page.locator('[data-schema="SetModeResult"]')).to_have_count(1)
                wait_for(lambda: page.locator("#docs-title").inner_text().startswith("gatherwise sidecar"), 30,
                         "the title from /openapi.json")
                assert elsewhere == [] and errors == [], (elsewhere, errors)
            finally:
                browser.close()
        assert httpx.get(f"{url}/healthz", timeout=10).status_code == 200
        assert proc.stop() == 0, "".join(proc.output)
    finally:
        if proc.popen.poll() is None:
            proc.popen.kill()
            proc.popen.wait(30)
