"""`gatherwise sidecar [--config FILE] [--host H] [--port N] [--shm-dir DIR]`: serve the sidecar with uvicorn.

Binds 127.0.0.1 unless configured otherwise; port 0 picks a free port. Prints its URL once listening.
uvicorn handles SIGINT/SIGTERM: it stops serving, then the app's lifespan stops the sidecar's loop and flushes traces.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import logging
import signal
import socket
import sys
from types import FrameType

import uvicorn

from gatherwise.config import ConfigError, GatherwiseConfig, load_config
from gatherwise.sidecar.api.app import create_app
from gatherwise.sidecar.api.header_timeout import header_timeout_protocol
from gatherwise.sidecar.api.host_check import HostCheck, allowed_hosts
from gatherwise.sidecar.state import build_state

TICKS_PER_SECOND = 10  # uvicorn.Server.on_tick's counter unit: it expects to run every 0.1 s


def parse_args(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="gatherwise sidecar", description="Serve metrics, traces and the control API.")
    p.add_argument("--config", help="YAML config file (default: built-in defaults + GATHERWISE_* env)")
    p.add_argument("--host", help="address to bind (default: sidecar.host, 127.0.0.1)")
    p.add_argument("--port", type=int, help="port to bind, 0 = any free port (default: sidecar.port, 9400)")
    p.add_argument("--shm-dir", help="where engines put their rings (default: engine.shm_dir)")
    p.add_argument("--log-level", default="info", choices=["debug", "info", "warning", "error"])
    return p.parse_args(argv)


def apply_overrides(cfg: GatherwiseConfig, args: argparse.Namespace) -> GatherwiseConfig:
    sidecar = cfg.sidecar.replace(**{k: v for k, v in (("host", args.host), ("port", args.port)) if v is not None})
    engine = cfg.engine.replace(shm_dir=args.shm_dir) if args.shm_dir else cfg.engine
    return cfg.replace(sidecar=sidecar, engine=engine)


class QuietServer(uvicorn.Server):
    """uvicorn's server, waking once a second instead of ten times. Its tick refreshes the Date header (once a
    second anyway) and looks for a stop request; here a stop request wakes it at once instead. The sidecar shares
    its host with the engine: those ten wakeups a second cost an idle sidecar ~0.15 % of a core on a loaded
    2-core host (docs/BENCHMARKS.md, "Sidecar CPU")."""

    _stop_requested: asyncio.Event | None = None

    async def main_loop(self) -> None:
        loop = asyncio.get_running_loop()
        self._stop_requested = stop = asyncio.Event()
        self._wake = lambda: loop.call_soon_threadsafe(stop.set)
        counter = 0  # on_tick refreshes the Date header when counter % TICKS_PER_SECOND == 0
        while not await self.on_tick(counter):
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), 1.0)
            counter += TICKS_PER_SECOND

    def handle_exit(self, sig: int, frame: FrameType | None) -> None:
        super().handle_exit(sig, frame)
        if self._stop_requested is not None:
            self._wake()


def bind(host: str, port: int) -> socket.socket:
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    # IPPROTO_TCP named: asyncio turns Nagle off (TCP_NODELAY) only on sockets whose proto says TCP, and an
    # accepted socket inherits the listener's. With proto 0, a response's header and body writes meet the
    # client's delayed ACK and every keep-alive request after the first takes about 40 ms.
    sock = socket.socket(family, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((host, port))
    sock.listen(2048)  # queue connections from now on, so "listening on" below is already true
    sock.set_inheritable(True)
    return sock


def main(argv: list[str] | None = None) -> int:
    args = parse_args(sys.argv[1:] if argv is None else argv)
    logging.basicConfig(level=args.log_level.upper(), format="%(asctime)s %(name)s %(levelname)s %(message)s")
    try:
        cfg = apply_overrides(load_config(args.config), args)
    except ConfigError as exc:
        print(f"gatherwise sidecar: {exc}", file=sys.stderr)
        return 2
    app = create_app(build_state(cfg))
    # where the socket is bound, outermost: requests reach it by name only through the socket
    app.add_middleware(HostCheck, allowed=allowed_hosts(cfg.sidecar.host, cfg.sidecar.allowed_hosts))
    try:
        sock = bind(cfg.sidecar.host, cfg.sidecar.port)
    except OSError as exc:
        print(f"gatherwise sidecar: cannot bind {cfg.sidecar.host}:{cfg.sidecar.port}: {exc}", file=sys.stderr)
        return 2
    host, port = sock.getsockname()[:2]
    url_host = f"[{host}]" if ":" in host else host
    print(f"gatherwise sidecar listening on http://{url_host}:{port} (engines in {cfg.engine.shm_dir})", flush=True)
    server = QuietServer(uvicorn.Config(app, log_level="warning", access_log=False, lifespan="on",
                                        http=header_timeout_protocol(cfg.sidecar.header_timeout_seconds)))
    # uvicorn shuts down gracefully on SIGINT/SIGTERM, then re-raises the signal into the handler it found:
    # make that a no-op so a requested stop exits 0 instead of dying by the signal.
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: None)
    server.run(sockets=[sock])
    print("gatherwise sidecar stopped", flush=True)
    return 0
