"""The live page in a real browser (Debian's chromium, driven by Playwright) against a real TP=2 reference engine and
a real uvicorn sidecar: it loads without console errors, its plots fill and move, a pin made on the page lands on
the engine, forged engine strings show as text, and it still answers (and says so) once the engine has stopped.

Skipped where chromium or playwright is missing; with CI=true that is a failure. Screenshots go to tmp_path, and
to docs/img/ with GATHERWISE_UPDATE_SCREENSHOTS=1 (how the README's picture is made).
"""

from __future__ import annotations

import os
import re
import shutil
import time
from pathlib import Path
from typing import TYPE_CHECKING

import httpx
import pytest
import yaml

from gatherwise.modes import LABEL_OF_CODE, bucket_label, bucket_of
from gatherwise.shm_format.engine_info import RankInfo, info_path, read_rank_info
from gatherwise.shm_format.engine_sample import EngineSample, write_sample
from gatherwise.shm_format.hooks_off import NoticeWriter
from gatherwise.shm_format.private_files import write_private_file
from gatherwise.shm_format.ring import ring_path
from gatherwise.sidecar.ingest.ring_reader import RingReader
from tests._sidecar import ROOT, start_engine, start_sidecar, wait_for
from tests.conftest import IN_CI

if TYPE_CHECKING:
    from playwright.sync_api import Page

TOKEN = "page-test-token"
FORGED = '<img src=x onerror="document.title=\'owned\'"><script>document.title="owned"</script>'
# What chromium needs here as root, and nothing that reaches a network: Playwright adds --headless and a fresh
# profile (--user-data-dir) of its own.
CHROMIUM_ARGS = ["--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run", "--disable-background-networking",
                 "--disable-component-update", "--disable-sync"]
pytestmark = [pytest.mark.slow, pytest.mark.timeout(400)]


def browser_or_skip() -> str:
    """chromium's path; a skip with the reason where it or playwright is missing (a failure under CI=true)."""
    problems = []
    try:
        import playwright.sync_api  # noqa: F401
    except ImportError:
        problems.append("playwright is not installed (pip install -e '.[dev]')")
    chromium = shutil.which("chromium")
    if chromium is None:
        problems.append("chromium is not installed (make apt as root, or apt-get install --no-install-recommends "
                        "chromium)")
    if not problems:
        assert chromium is not None
        return chromium
    message = "the live page's browser test cannot run: " + "; ".join(problems)
    if IN_CI:
        pytest.fail(f"{message}; CI installs both, so this is a failure", pytrace=False)
    pytest.skip(message)


def write_config(tmp_path: Path, shm_dir: str) -> str:
    cfg = {"engine": {"shm_dir": shm_dir, "initial_mode": "all_gather"},
           "telemetry": {"ring_capacity": 4096},
           "sidecar": {"poll_interval_seconds": 0.02},
           "traces": {"enabled": False},
           "policy": {"mode": "auto"}}
    path = tmp_path / "gatherwise.yaml"
    path.write_text(yaml.safe_dump(cfg))
    return str(path)


def forge_rank0_info(engine_dir: str) -> None:
    """Rewrite rank 0's info file as an engine could: its kind and model are whatever text the engine chose."""
    info = wait_for(lambda: read_rank_info(engine_dir, 0), 60, "rank 0's info file")
    forged = RankInfo(FORGED, info.version, 0, info.node, info.pid, info.sampler, f"model {FORGED}")
    write_private_file(info_path(engine_dir, 0), forged.to_json())


def forge_sample(engine_dir: str) -> None:
    """A sample as an engine could write it (this engine, the random model's load, writes none)."""
    write_sample(engine_dir, EngineSample(f"prompt {FORGED}", f"output {FORGED}\nits second line", 9,
                                          time.time_ns()))


def records_from(shm_dir: str, engine_id: str, first_call: int) -> list:
    with RingReader(ring_path(shm_dir, int(engine_id, 16), 0)) as reader:
        records, _ = reader.read_new(4096)
    return [r for r in records if r.call_index >= first_call]


def save(page: Page, tmp_path: Path, name: str) -> None:
    page.screenshot(path=str(tmp_path / name), full_page=True)
    if os.environ.get("GATHERWISE_UPDATE_SCREENSHOTS") == "1":
        shutil.copy(tmp_path / name, ROOT / "docs" / "img" / name)


def test_live_page_in_a_real_browser(tmp_path, shm_dir):
    chromium = browser_or_skip()
    from playwright.sync_api import Dialog, expect, sync_playwright

    config = write_config(tmp_path, shm_dir)
    engine = start_engine(shm_dir, tp=2, duration=300, config=config)
    notices = NoticeWriter()
    sidecar = None
    try:
        engine_id = engine.wait_line(r"gatherwise engine ([0-9a-f]{16}):", 120).group(1)
        forge_rank0_info(os.path.join(shm_dir, engine_id))
        forge_sample(os.path.join(shm_dir, engine_id))
        notices.publish(shm_dir, "vLLM", "unsupported_version", f"forged detail {FORGED}")
        sidecar, url = start_sidecar(shm_dir, config=config, env_extra={"GATHERWISE_API_TOKEN": TOKEN})
        wait_for(lambda: httpx.get(f"{url}/v1/mode", timeout=10).status_code == 200, 90, "the engine to attach")

        with sync_playwright() as pw:
            browser = pw.chromium.launch(executable_path=chromium, args=CHROMIUM_ARGS)
            try:
                page = browser.new_page(viewport={"width": 1400, "height": 1000})
                errors: list[str] = []
                elsewhere: list[str] = []
                dialogs: list[str] = []
                page.on("console", lambda m: errors.append(m.text) if m.type == "error" else None)
                page.on("pageerror", lambda e: errors.append(str(e)))
                page.on("request", lambda r: None if r.url.startswith(url) else elsewhere.append(r.url))
                def dismiss(dialog: Dialog) -> None:
                    dialogs.append(dialog.message)
                    dialog.dismiss()

                page.on("dialog", dismiss)
                page.goto(url)

                # the engine and its forged strings, shown as text
                expect(page.locator("#engine")).to_contain_text(engine_id, timeout=30_000)
                expect(page.locator("#engine")).to_contain_text(FORGED)
                expect(page.locator("#engine")).to_contain_text(f"model {FORGED}")
                # the engine's newest output beside its logits path, as text too
                expect(page.locator("#sample .prompt")).to_have_text(f"prompt {FORGED}")
                expect(page.locator("#sample .output")).to_contain_text(f"output {FORGED}")
                expect(page.locator("#sample .output")).to_contain_text("its second line")
                expect(page.locator("#sample .tokens")).to_have_text("9")
                expect(page.locator("#sample .age")).to_contain_text("s ago")
                expect(page.locator("#banners .hooks-off")).to_contain_text(f"forged detail {FORGED}")
                assert page.locator("img").count() == 0 and page.locator("body script").count() == 0
                assert page.title() == "gatherwise live"
                expect(page.locator("#engine")).to_contain_text("controller")
                expect(page.locator("#ranks tbody tr")).to_have_count(2)
                expect(page.locator("#sampler")).to_contain_text("sharded")

                # the plots fill, then move as calls arrive
                first_plot = page.locator("#plots svg").first
                expect(first_plot).to_be_visible(timeout=30_000)
                wait_for(lambda: int(page.locator("#plot-share").get_attribute("data-points") or 0) >= 3, 60,
                         "three history points")
                before = page.locator("#plot-share").get_attribute("data-points")
                path_before = first_plot.locator("polyline").first.get_attribute("points")
                wait_for(lambda: page.locator("#plot-share").get_attribute("data-points") != before, 30,
                         "a new history point")
                wait_for(lambda: first_plot.locator("polyline").first.get_attribute("points") != path_before, 30,
                         "the plot to move")
                assert page.locator("#plots polyline").count() >= 2  # p50 and p99

                # a pin from the page, with the token typed in: it lands on every rank
                live = httpx.get(f"{url}/v1/live", timeout=10).json()
                bucket = live["history"][-1]["paths"][0]["bucket"]
                apply = page.locator(f'button.apply[data-bucket="{bucket}"]')
                expect(apply).to_be_disabled()  # read-only without a token
                page.fill("#token", TOKEN)
                page.click("#token-save")
                expect(apply).to_be_enabled(timeout=10_000)
                page.select_option(f'select[data-bucket="{bucket}"]', "gather")
                apply.click()
                result = page.locator("#switch-result")
                expect(result).to_contain_text("applied from call", timeout=30_000)
                applied = re.search(r"applied from call (\d+)", result.inner_text())
                assert applied is not None
                apply_call = int(applied.group(1))
                # now, while it is among the newest: auto's probes of the other buckets go on, and the page lists the
                # newest 30 decisions only
                expect(page.locator("#decisions li.manual").first).to_contain_text(f"bucket {bucket} → gather",
                                                                                  timeout=10_000)
                mode = httpx.get(f"{url}/v1/mode", timeout=10).json()
                assert mode["active"][bucket] == "gather" and mode["pinned"][bucket] == "gather"
                expect(page.locator(f'#modes tr[data-bucket="{bucket}"] td.active')).to_have_text("gather",
                                                                                                 timeout=10_000)
                later = wait_for(lambda: [r for r in records_from(shm_dir, engine_id, apply_call)
                                          if bucket_label(bucket_of(max(r.rows, 1))) == bucket], 120,
                                 f"records of bucket {bucket} after call {apply_call}")
                assert {LABEL_OF_CODE[r.mode] for r in later} == {"gather"}
                pinned_p50 = page.locator(f"#plot-bucket-{bucket} polyline.gather.p50").last
                wait_for(lambda: pinned_p50.count() and len((pinned_p50.get_attribute("points") or "").split()) >= 3,
                         90, "the pinned mode in the bucket's plot, three points")
                save(page, tmp_path, "live_page.png")

                # the engine stops: the page still answers and says so
                assert engine.stop() == 0
                expect(page.locator("#banner-engine")).to_contain_text("not running", timeout=30_000)
                page.reload()
                expect(page.locator("#banner-engine")).to_contain_text("not running", timeout=30_000)
                expect(page.locator("#status")).to_have_text("engine stopped")
                save(page, tmp_path, "live_page_stopped.png")

                assert errors == [], errors
                assert elsewhere == [], elsewhere
                assert dialogs == [] and page.title() == "gatherwise live"
            finally:
                browser.close()
    finally:
        for fd in notices._held.values():  # the forged notice's lock: its file goes with shm_dir
            os.close(fd)
        engine.stop()
        if sidecar is not None:
            sidecar.stop()
