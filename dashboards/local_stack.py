"""The local stack without Docker: engine + sidecar + (when installed) the real Prometheus, all on 127.0.0.1.

The same pieces as docker-compose.yml — `gatherwise engine`, `gatherwise sidecar`, and Prometheus with the
compose's config and rules (targets rewritten) — in a private shared-memory directory, so tests and the demo can
run it next to anything else. `stop()` ends every process it started and removes the shared-memory files.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
import urllib.request
from dataclasses import dataclass, field
from http import HTTPStatus
from pathlib import Path

from gatherwise.child_process import start_child
from gatherwise.dashboards.local_prometheus import LocalPrometheus, start_prometheus, write_local_config
from gatherwise.free_port import free_port


def private_shm_dir() -> Path:
    """A fresh directory on tmpfs (/dev/shm when writable), so the rings are real shared memory."""
    base = Path("/dev/shm") if os.access("/dev/shm", os.W_OK) else Path("/tmp")
    path = base / f"gatherwise-stack-{os.getpid()}-{os.urandom(4).hex()}"
    path.mkdir(mode=0o700)  # private at any umask (the engine refuses a shm_dir others can write)
    return path


@dataclass
class LocalStack:
    work_dir: Path
    shm_dir: Path
    sidecar_url: str
    prometheus: LocalPrometheus | None = None
    processes: list[subprocess.Popen] = field(default_factory=list)

    def stop(self, timeout: float = 15.0) -> None:
        """SIGTERM in reverse start order (Prometheus, sidecar, engine), SIGKILL after `timeout`; remove shm."""
        if self.prometheus is not None:
            self.prometheus.stop()
        for process in reversed(self.processes):
            if process.poll() is None:
                process.terminate()
        for process in reversed(self.processes):
            try:
                process.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()
        shutil.rmtree(self.shm_dir, ignore_errors=True)

    def __enter__(self) -> LocalStack:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


def _gatherwise(args: list[str], log: Path, env: dict[str, str]) -> subprocess.Popen:
    with log.open("wb") as out:  # a file, not a pipe: nobody reads it while the stack runs
        return start_child([sys.executable, "-m", "gatherwise.cli", *args], stdout=out, stderr=out, env=env)


def wait_ready(url: str, processes: list[subprocess.Popen], timeout: float) -> None:
    """Until GET url answers 200 (the sidecar's /readyz: engine attached, heartbeat fresh)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        dead = [p.args for p in processes if p.poll() is not None]
        if dead:
            raise RuntimeError(f"exited before the stack was ready: {dead}")
        try:
            with urllib.request.urlopen(url, timeout=1) as response:
                if response.status == HTTPStatus.OK:
                    return
        except OSError:
            pass
        time.sleep(0.2)
    raise TimeoutError(f"{url} not ready after {timeout} s")


def start_local_stack(
    work_dir: Path,
    *,
    tp: int = 2,
    workload: str = "mixed",
    sampling: str = "mixed",
    engine_args: tuple[str, ...] = (),
    env: dict[str, str] | None = None,
    with_prometheus: bool = True,
    scrape_interval: str = "1s",
    ready_timeout: float = 120.0,
) -> LocalStack:
    """Start engine, sidecar and (if `with_prometheus` and installed) Prometheus; return when all are ready.

    `env` adds to the processes' environment (e.g. GATHERWISE_API_TOKEN, OTEL_EXPORTER_OTLP_ENDPOINT).
    Logs go to work_dir/engine.log, work_dir/sidecar.log and work_dir/prometheus-data.log.
    """
    work_dir.mkdir(parents=True, exist_ok=True)
    full_env = {**os.environ, **(env or {})}
    port = free_port()
    stack = LocalStack(work_dir, private_shm_dir(), f"http://127.0.0.1:{port}")
    try:
        shm = str(stack.shm_dir)
        engine = ["engine", "--tp", str(tp), "--workload", workload, "--sampling", sampling, "--shm-dir", shm,
                  *engine_args]
        stack.processes.append(_gatherwise(engine, work_dir / "engine.log", full_env))
        sidecar = ["sidecar", "--host", "127.0.0.1", "--port", str(port), "--shm-dir", shm]
        stack.processes.append(_gatherwise(sidecar, work_dir / "sidecar.log", full_env))
        if with_prometheus and shutil.which("prometheus"):
            config = write_local_config(work_dir / "prometheus", [f"127.0.0.1:{port}"], scrape_interval)
            stack.prometheus = start_prometheus(config, work_dir / "prometheus-data", free_port())
        wait_ready(f"{stack.sidecar_url}/readyz", stack.processes, ready_timeout)
    except BaseException:
        stack.stop()
        raise
    return stack
