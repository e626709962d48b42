"""The real Prometheus binary with the compose stack's config and rules, scraping targets on 127.0.0.1.

Used by tests and the demo: the same prometheus.yml and rule files as docker-compose.yml, only the sidecar
target rewritten, so what the tests check is what the stack runs.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import time
import urllib.error
import urllib.parse
import urllib.request
from dataclasses import dataclass
from http import HTTPStatus
from pathlib import Path

import yaml

from gatherwise.child_process import start_child, stop_child

CONFIG = Path(__file__).parent / "prometheus" / "prometheus.yml"
SIDECAR_JOB = "gatherwise-sidecar"
STOP_TIMEOUT_S = 10


def write_local_config(out_dir: Path, targets: list[str], scrape_interval: str | None = None) -> Path:
    """Copy prometheus.yml and its rule files into out_dir, scraping `targets` (host:port) instead of sidecar:9400."""
    config = yaml.safe_load(CONFIG.read_text(encoding="utf-8"))
    jobs = [job for job in config["scrape_configs"] if job["job_name"] == SIDECAR_JOB]
    if len(jobs) != 1:
        raise ValueError(f"{CONFIG}: expected one scrape job {SIDECAR_JOB!r}, found {len(jobs)}")
    jobs[0]["static_configs"] = [{"targets": list(targets)}]
    if scrape_interval is not None:
        config["global"]["scrape_interval"] = scrape_interval
        config["global"]["scrape_timeout"] = scrape_interval
        config["global"]["evaluation_interval"] = scrape_interval
    out_dir.mkdir(parents=True, exist_ok=True)
    for rule_file in config.get("rule_files", []):
        shutil.copy(CONFIG.parent / rule_file, out_dir / rule_file)
    path = out_dir / "prometheus.yml"
    path.write_text(yaml.safe_dump(config, sort_keys=False), encoding="utf-8")
    return path


@dataclass
class LocalPrometheus:
    process: subprocess.Popen
    url: str

    def api(self, endpoint: str, **params: str) -> dict:
        """GET /api/v1/<endpoint>; returns the decoded body, also for 4xx answers (they carry the error)."""
        url = f"{self.url}/api/v1/{endpoint}?{urllib.parse.urlencode(params)}"
        try:
            with urllib.request.urlopen(url, timeout=10) as response:
                return json.load(response)
        except urllib.error.HTTPError as error:
            return json.load(error)

    def query(self, expr: str) -> dict:
        return self.api("query", query=expr)

    def stop(self) -> None:
        stop_child(self.process, STOP_TIMEOUT_S)


def start_prometheus(config: Path, data_dir: Path, port: int, timeout: float = 20.0) -> LocalPrometheus:
    """Start `prometheus` on 127.0.0.1:port with exemplar storage on; returns once /-/ready answers.

    Its log goes to <data_dir>.log (a file, not a pipe nobody reads, which would block it when full).
    """
    log_path = data_dir.with_suffix(".log")
    binary = shutil.which("prometheus")
    if binary is None:
        raise FileNotFoundError("prometheus is not installed (apt-get install --no-install-recommends prometheus)")
    with log_path.open("wb") as log:  # the child keeps its own descriptor
        process = start_child(  # dies with whoever started it, never left running
            [
                binary,
                f"--config.file={config}",
                f"--storage.tsdb.path={data_dir}",
                f"--web.listen-address=127.0.0.1:{port}",
                "--enable-feature=exemplar-storage",
            ],
            stdout=subprocess.DEVNULL,
            stderr=log,
        )
    server = LocalPrometheus(process, f"http://127.0.0.1:{port}")
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if process.poll() is not None:
            tail = log_path.read_text(errors="replace")[-2000:]
            raise RuntimeError(f"prometheus exited with {process.returncode}; end of {log_path}:\n{tail}")
        try:
            with urllib.request.urlopen(f"{server.url}/-/ready", timeout=1) as response:
                if response.status == HTTPStatus.OK:
                    return server
        except OSError:
            time.sleep(0.1)
    server.stop()
    raise TimeoutError(f"prometheus on port {port} not ready after {timeout} s")
