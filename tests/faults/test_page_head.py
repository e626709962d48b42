"""HEAD on the page's routes answers as GET does, without the body: `curl -I` shows the CSP."""

from __future__ import annotations

import subprocess

import pytest

from gatherwise.sidecar.api.routes_page import CSP
from tests.faults._faults import sidecar_with_token

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]


def test_head_on_the_page_routes_shows_their_headers(shm_dir):
    proc, url, api = sidecar_with_token(shm_dir)
    try:
        for path in ("/", "/docs", "/page/page.js", "/page/page.css"):
            head = api.head(path)
            assert head.status_code == 200 and head.headers["content-security-policy"] == CSP, (path, head.headers)
            assert head.content == b"" and head.headers["content-type"] == api.get(path).headers["content-type"]
        assert api.head("/page/nothing.js").status_code == 404
        curl = subprocess.run(["curl", "-sI", f"{url}/"], capture_output=True, text=True, timeout=60)
        assert curl.stdout.startswith("HTTP/1.1 200") and f"content-security-policy: {CSP}" in curl.stdout.lower()
        assert proc.stop() == 0, "".join(proc.output)
    finally:
        if proc.popen.poll() is None:
            proc.popen.kill()
            proc.popen.wait(30)
