"""A decision whose evidence holds null where a number or an object belongs: the sidecar refuses it where it
reads it back (the saved state), and the live page, handed such items anyway, draws every other item and panel
and still says the sidecar answers."""

from __future__ import annotations

import json
import os

import pytest

from gatherwise.shm_format.hooks_off import NoticeWriter
from tests._sidecar import wait_for
from tests.faults._faults import (
    assert_sidecar_serves,
    running_engine,
    sidecar_with_token,
    state_saved_after_a_switch,
    write_state,
)
from tests.sidecar.api.test_page_browser import CHROMIUM_ARGS, browser_or_skip

pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]
BAD_EVIDENCE = [{"paired": {"gather": None}}, {"paired": None}, {"mix": None}, {"probe_calls": None},
                {"paired": {"gather": {"probes": 2, "ratio": 0.9, "coverage": 1.0, "kinds": {"greedy": None}}}}]


def test_null_evidence_in_the_saved_state_is_refused(shm_dir):
    engine, state_path, saved = state_saved_after_a_switch(shm_dir)
    proc = None
    try:
        for evidence in BAD_EVIDENCE:
            doc = {**saved, "decisions": [{**saved["decisions"][-1], "evidence": evidence}]}
            write_state(state_path, json.dumps(doc))
            proc, _url, api = sidecar_with_token(shm_dir)
            wait_for(lambda: api.get("/readyz").status_code == 200, 120, "control attached")  # noqa: B023
            decisions = api.get("/v1/decisions").json()["decisions"]
            assert all(d["evidence"] != evidence for d in decisions), decisions
            assert_sidecar_serves(proc, api)
            assert proc.stop() == 0, "".join(proc.output)
            output = "".join(proc.output)
            assert f"{state_path}: unreadable sidecar state: decisions.0.evidence" in output, output
    finally:
        if proc is not None and proc.popen.poll() is None:
            proc.popen.kill()
            proc.popen.wait(30)
        engine.stop()


def test_one_unreadable_decision_never_blanks_the_page(shm_dir):
    """GET /v1/decisions answered with bad items (as an older or forged sidecar could): the page draws the good
    decision, says which items it could not draw, keeps its other panels and the hooks-off banner."""
    chromium = browser_or_skip()
    from playwright.sync_api import expect, sync_playwright

    engine, engine_id = running_engine(shm_dir)
    notices = NoticeWriter()
    proc, url, api = sidecar_with_token(shm_dir)
    try:
        notices.publish(shm_dir, "vLLM", "unsupported_version", "a hooks-off notice")
        wait_for(lambda: api.get("/readyz").status_code == 200, 120, "the sidecar attached")
        assert api.put("/v1/mode", params={"wait": 60}, json={"mode": "gather", "buckets": [2]}).status_code == 200
        good = api.get("/v1/decisions").json()["decisions"][-1]
        bad = [{**good, "id": 100 + i, "evidence": e} for i, e in enumerate(BAD_EVIDENCE)]
        bad.append({**good, "id": 200, "buckets": None, "previous": None})
        served = json.dumps({"engine": f"{engine_id:016x}", "decisions": [good, *bad]})

        with sync_playwright() as pw:
            browser = pw.chromium.launch(executable_path=chromium, args=CHROMIUM_ARGS)
            try:
                page = browser.new_page(viewport={"width": 1400, "height": 1000})
                errors: list[str] = []
                page.on("console", lambda m: errors.append(m.text) if m.type == "error" else None)
                page.on("pageerror", lambda e: errors.append(str(e)))
                page.route("**/v1/decisions*", lambda route: route.fulfill(
                    status=200, content_type="application/json", body=served))
                page.goto(url)
                wait_for(lambda: int(page.locator("body").get_attribute("data-polls") or 0) >= 3, 60, "three polls")
                expect(page.locator("#status")).to_have_text("engine up")
                expect(page.locator("#banners .hooks-off")).to_contain_text("a hooks-off notice")
                expect(page.locator("#engine")).to_contain_text(f"{engine_id:016x}")
                expect(page.locator(f'#decisions li[data-decision="{good["id"]}"]')).to_contain_text(
                    "bucket 2 → gather")
                for item in bad[:-1]:  # each drawn in its place, its evidence as far as it can be read
                    expect(page.locator(f'#decisions li[data-decision="{item["id"]}"]')).to_contain_text(
                        "bucket 2 → gather")
                for thrown in ("100", "104"):  # a null where an object is read
                    expect(page.locator(f'#decisions li[data-decision="{thrown}"] .evidence')).to_contain_text(
                        "evidence unreadable")
                expect(page.locator('#decisions li[data-decision="200"]')).to_contain_text("unreadable")
                assert errors == [], errors
            finally:
                browser.close()
        assert proc.stop() == 0, "".join(proc.output)
    finally:
        for fd in notices._held.values():  # the notice's lock: its file goes with shm_dir
            os.close(fd)
        if proc.popen.poll() is None:
            proc.popen.kill()
            proc.popen.wait(30)
        engine.stop()
