"""Engine strings on the live page, in chromium: hundreds of hooks-off notices (every worker of a large engine)
make a few banners, not a page thousands of pixels long; bidirectional controls in them show as their codes
instead of reordering the text."""

from __future__ import annotations

import os

import pytest

from gatherwise.shm_format.hooks_off import NoticeWriter
from tests._sidecar import wait_for
from tests.faults._faults import sidecar_with_token
from tests.sidecar.api.test_page_browser import CHROMIUM_ARGS, browser_or_skip

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]
NOTICES = 256  # what the sidecar reads at most per scan


def test_many_hooks_off_notices_make_one_banner_per_engine_and_reason(shm_dir):
    chromium = browser_or_skip()
    from playwright.sync_api import expect, sync_playwright

    writers = [NoticeWriter() for _ in range(NOTICES)]
    for i, writer in enumerate(writers):  # this process stands in for each worker
        writer.publish(shm_dir, "vLLM", ("unsupported_version", "unsupported_feature")[i % 2],
                       f"worker {i}: the hooks are off", tp_rank=i)
    proc, url, api = sidecar_with_token(shm_dir)
    try:
        wait_for(lambda: len(api.get("/v1/engine").json()["hooks_off"]) == NOTICES, 60, "every notice read")
        with sync_playwright() as pw:
            browser = pw.chromium.launch(executable_path=chromium, args=CHROMIUM_ARGS)
            try:
                page = browser.new_page(viewport={"width": 1400, "height": 1000})
                page.goto(url)
                banners = page.locator("#banners .hooks-off")
                expect(banners).to_have_count(2, timeout=30_000)
                for i in range(2):
                    assert banners.nth(i).get_attribute("data-count") == str(NOTICES // 2)
                expect(banners.first).to_contain_text(f"in {NOTICES // 2} vLLM processes")
                expect(banners.first).to_contain_text("other details")
                assert page.locator("#banners").bounding_box()["height"] < 400  # type: ignore[index]
            finally:
                browser.close()
        assert proc.stop() == 0, "".join(proc.output)
    finally:
        for writer in writers:  # the notices' locks: their files go with shm_dir
            for fd in writer._held.values():
                os.close(fd)
        if proc.popen.poll() is None:
            proc.popen.kill()
            proc.popen.wait(30)


BIDI = "\u202e"  # RIGHT-TO-LEFT OVERRIDE: what follows it is shown reversed
POP = "\u202c"  # POP DIRECTIONAL FORMATTING


def test_bidi_controls_in_engine_strings_are_shown_as_codes(shm_dir):
    chromium = browser_or_skip()
    from playwright.sync_api import expect, sync_playwright

    notices = NoticeWriter()
    notices.publish(shm_dir, "vLLM", "unsupported_version", f"mode {BIDI}rehtag{POP} is fine")
    proc, url, api = sidecar_with_token(shm_dir)
    try:
        wait_for(lambda: api.get("/v1/engine").json()["hooks_off"], 60, "the notice read")
        with sync_playwright() as pw:
            browser = pw.chromium.launch(executable_path=chromium, args=CHROMIUM_ARGS)
            try:
                page = browser.new_page()
                page.goto(url)
                banner = page.locator("#banners .hooks-off")
                expect(banner).to_contain_text("mode ⟨U+202E⟩rehtag⟨U+202C⟩ is fine", timeout=30_000)
                assert BIDI not in page.locator("body").inner_text()
            finally:
                browser.close()
        assert proc.stop() == 0, "".join(proc.output)
    finally:
        for fd in notices._held.values():
            os.close(fd)
        if proc.popen.poll() is None:
            proc.popen.kill()
            proc.popen.wait(30)
