"""A mode that ran within a single one-second interval (what every probe produces) is one history point: the
page draws it as a marker, not as a polyline of one point, which renders nothing. Real engine, real sidecar, the
page in chromium."""

from __future__ import annotations

import functools
import time
from collections.abc import Callable

import pytest

from tests._sidecar import wait_for
from tests.faults._faults import running_engine, sidecar_with_token
from tests.sidecar.api.test_page_browser import CHROMIUM_ARGS, browser_or_skip

pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]
BUCKET = "2"  # the fixed:2 workload's batches
FLIPS = 3  # each flip is one interval's worth of sharded calls, or two where it straddles a boundary


def closed_after(newest_point: Callable[[], float], flipped: float) -> bool:
    """A point newer than a second after the flip: the interval holding the flip is in the history."""
    return newest_point() > flipped + 1.0


def test_a_mode_seen_in_one_interval_is_drawn(shm_dir):
    chromium = browser_or_skip()
    from playwright.sync_api import sync_playwright

    engine, _engine_id = running_engine(shm_dir)
    proc, url, api = sidecar_with_token(shm_dir)
    try:
        wait_for(lambda: api.get("/readyz").status_code == 200, 120, "the sidecar attached")

        def newest_point() -> float:
            history = api.get("/v1/live", params={"points": 2}).json()["history"]
            return history[-1]["time"] if len(history) == 2 else 0.0

        wait_for(newest_point, 60, "the history's first points")
        for _ in range(FLIPS):  # sharded for a moment, like a probe
            for mode in ("sharded", "all_gather"):
                put = api.put("/v1/mode", params={"wait": 60}, json={"mode": mode, "buckets": [int(BUCKET)]})
                assert put.status_code == 200, put.text
            wait_for(functools.partial(closed_after, newest_point, time.time()), 30, "the flip's interval closed")

        def sharded_points() -> int:
            history = api.get("/v1/live", params={"points": 120}).json()["history"]
            return sum(any(q["bucket"] == BUCKET and q["mode"] == "sharded" for q in p["paths"]) for p in history)

        assert sharded_points() >= 1
        with sync_playwright() as pw:
            browser = pw.chromium.launch(executable_path=chromium, args=CHROMIUM_ARGS)
            try:
                page = browser.new_page(viewport={"width": 1400, "height": 1000})
                errors: list[str] = []
                page.on("pageerror", lambda e: errors.append(str(e)))
                page.goto(url)
                plot = page.locator(f"#plot-bucket-{BUCKET}")
                wait_for(lambda: plot.count() == 1, 60, f"the plot of bucket {BUCKET}")
                sharded = plot.locator(".sharded")
                wait_for(lambda: sharded.count() >= 2, 60, "sharded's p50 and p99 drawn")
                drawn = page.evaluate("""bucket => {  // one redraw's worth, read at once
                    const plot = document.getElementById(`plot-bucket-${bucket}`);
                    const size = e => { const b = e.getBoundingClientRect(); return [b.width, b.height]; };
                    return {
                      polylines: [...document.querySelectorAll("#plots polyline")].map(p => p.getAttribute("points")),
                      markers: [...plot.querySelectorAll("circle.sharded")].map(size),
                      lines: plot.querySelectorAll("polyline.sharded").length,
                    };
                }""", BUCKET)
                assert all(len(points.split()) >= 2 for points in drawn["polylines"]), drawn["polylines"]
                assert len(drawn["markers"]) + drawn["lines"] >= 2, drawn
                assert all(w > 0 and h > 0 for w, h in drawn["markers"]), drawn["markers"]
                assert errors == [], errors
            finally:
                browser.close()
        assert proc.stop() == 0, "".join(proc.output)
    finally:
        if proc.popen.poll() is None:
            proc.popen.kill()
            proc.popen.wait(30)
        engine.stop()
