"""`gatherwise demo`: the live view shows real numbers, and Ctrl-C stops everything it started and leaves no
shared-memory files behind."""

import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

from tests._processes import processes_mentioning
from tests._repo import ROOT


def test_demo_shows_live_numbers_and_ctrl_c_cleans_up(tmp_path: Path) -> None:
    # the demo's work directory (its processes' logs) goes under tmp_path: removed by the demo on a clean stop, and
    # by pytest after a run that had to kill it
    proc = subprocess.Popen([sys.executable, "-m", "gatherwise.cli", "demo", "--interval", "1"], cwd=ROOT,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            env={**os.environ, "PYTHONUNBUFFERED": "1", "TMPDIR": str(tmp_path)})
    output: list[str] = []
    deadline = time.monotonic() + 240
    seen_numbers = seen_text = False
    assert proc.stdout is not None
    try:
        for line in proc.stdout:  # read until a whole screen with a latency row and a real answer was printed
            output.append(line)
            seen_numbers = seen_numbers or bool(re.match(r"\s+\d+\s+(all_gather|gather)\s+\d+\.\d+", line))
            seen_text = seen_text or bool(re.match(r"\s+→ .*[A-Za-z]{3}", line))
            if (seen_numbers and seen_text and line.startswith("flip by hand")) or time.monotonic() > deadline:
                break
        text = "".join(output)
        assert re.search(r"engine [0-9a-f]{16}\s+tp=3", text), text[-3000:]  # SmolLM2 by default
        # the model's own answer to a real question, next to the logits path's numbers
        assert re.search(r"latest output \(smollm2-float32, \d+ tokens.*\n\s+→ .*[A-Za-z]{3}", text), text[-3000:]
        assert "API docs http://127.0.0.1:" in text
        assert re.search(r"live page http://127\.0\.0\.1:\d+/ ", text), text[-3000:]
        proc.send_signal(signal.SIGINT)
        rest, _ = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:  # a failed assertion: still stop the demo the way a user would
            proc.send_signal(signal.SIGINT)
            try:
                proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                proc.kill()
    text += rest
    assert proc.returncode == 0, text[-3000:]
    shm_dir = re.search(r"shared-memory dir (\S+) removed", text)
    assert shm_dir, text[-3000:]
    assert not Path(shm_dir.group(1)).exists()
    assert processes_mentioning(shm_dir.group(1)) == []
    assert list(tmp_path.glob("gatherwise-demo-*")) == []
