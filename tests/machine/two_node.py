"""SGLang or vLLM TP=2 across two "nodes" on this Linux host, plain and with gatherwise, a sidecar on each node.

    sudo .venv-sglang/bin/python -m tests.machine.two_node --engine sglang --out out/two_node   # root: namespaces
    ... --engine vllm --rate 100mbit          # the link between the nodes limited (tc htb)
    ... --engine reference --sweep 1,4,16     # `gatherwise bench` across the nodes instead of the checks
    python -m tests.machine.two_node --list   # the checks, in the order they run (no root needed)

Run from the checkout's root, with an engine venv's Python (`make test-multinode` installs them).

A node is a network namespace joined to the other by a veth pair, with its own private `/dev/shm`
(gatherwise.bench.netns_nodes): what two hosts look like to the engine and to gatherwise. Node k runs the engine's
node k (one TP rank each; rank 0, the gather root and the control block, on node 0; two_node_engines.py)
with gloo over the veth, and, with gatherwise, a `gatherwise sidecar` beside it on the node's shm_dir; one
Prometheus in node 0 scrapes both sidecars.

The run: batched greedy requests through node 0's HTTP server, first on the plain engine, then with the plugin
while the controller (node 0's sidecar) switches the table all_gather -> gather -> sharded -> all_gather between
rounds, then with every bucket released to the auto policy for a while. It checks that every round's tokens are
the plain engine's, that both sidecars attached to their node's rank (node file, partial attach), that node 0's is
the controller and node 1's an observer (409 on a mutation, the role on /v1/mode and /readyz), that each exports
its own rank's series, that Prometheus scraped both and sees both ranks and one controller, and that the auto
policy probed on the controller and chose a mode for the batch's bucket: each of these is a check registered with
tests.machine.harness, named after its function. Writes OUT/two_node-ENGINE.json (each check's name: passed or
not); exit status 0 when every check passed. Everything it creates (namespaces, veths, mounts, processes) is gone
when it ends.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import secrets
import shlex
import shutil
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gatherwise.bench.netns_nodes import (
    NodeProcess,
    address,
    background,
    gloo_env,
    http,
    in_node,
    in_use,
    limit_link,
    set_up_network,
    tear_down_network,
)
from tests._repo import ROOT
from tests.machine.harness import Budget, Checks, Context, Result, list_checks, run_checks
from tests.machine.two_node_engines import ENGINES, Engine, Reference

SIDECAR_PORT, PROMETHEUS_PORT = 9400, 9090
PROMPTS = [[1, 15, 27, 99, 4000, 12], [7, 8], [31000, 5, 5, 5, 17, 23], [2]]
BUCKET = "4"  # the table bucket of a step of len(PROMPTS) rows
MAX_TOKENS = 12
SCHEDULE = ("all_gather", "gather", "sharded", "all_gather")  # the table before each round of requests
AUTO_SECONDS = 40.0  # how long the batch runs under the auto policy
# Fast enough to decide within AUTO_SECONDS at a few dozen calls a second; the defaults are for days of traffic.
AUTO_POLICY = {"margin": 0.05, "min_samples": 8, "window": 64, "dwell_seconds": 1.0, "probe_interval_seconds": 1.0,
               "probe_calls": 8, "probe_budget": 0.5, "max_sample_age_seconds": 60.0, "cost": "path"}
SHM_DIR = "/dev/shm/gatherwise"


def sidecar(k: int) -> str:
    return f"http://{address(k)}:{SIDECAR_PORT}"


def get(k: int, url: str) -> dict:
    code, text = http(k, "GET", url, timeout=10)
    return json.loads(text) if text.startswith("{") else {"status": code, "body": text[:300]}


def start_nodes(engine: Engine, model: str, plugin: bool, token: str, out: Path) -> list[NodeProcess]:
    nodes = []
    for k in (0, 1):
        env = {**os.environ, **engine.env(k), **gloo_env(k), "GATHERWISE_API_TOKEN": token}
        env.pop("GATHERWISE_ENABLE", None)
        script = ""
        if plugin:
            env.update(GATHERWISE_ENABLE="1", GATHERWISE_ENGINE_SHM_DIR=SHM_DIR)
            script += background([engine.gatherwise, "sidecar", "--host", address(k), "--port", str(SIDECAR_PORT),
                                  "--shm-dir", SHM_DIR], out / f"{engine.name}-sidecar{k}.log")
        script += "exec " + shlex.join(engine.command(k, model))
        nodes.append(NodeProcess(k, script, env, out / f"{engine.name}-{'gw' if plugin else 'plain'}-node{k}.log"))
    return nodes


def wait_ready(engine: Engine, nodes: list[NodeProcess], deadline_s: float = 900.0) -> None:
    deadline = time.monotonic() + deadline_s
    while time.monotonic() < deadline:
        if engine.ready():
            return
        gone = [k for k, n in enumerate(nodes) if n.exited() is not None]
        if gone:
            raise RuntimeError(f"{engine.name} node(s) {gone} exited before the group was ready (see the logs)")
        time.sleep(2)
    raise RuntimeError(f"{engine.name}: node 0 did not answer {engine.health_path()} within {deadline_s:.0f} s")


def wait_attached(k: int, deadline_s: float = 60.0) -> dict:
    deadline = time.monotonic() + deadline_s
    while True:
        info = get(k, f"{sidecar(k)}/v1/engine")
        if info.get("attached") or time.monotonic() > deadline:
            return info
        time.sleep(1)


class Prometheus:
    """The real Prometheus in node 0's namespace, scraping both sidecars with the stack's job and rules."""

    def __init__(self, out: Path) -> None:
        from gatherwise.dashboards.local_prometheus import write_local_config

        config = write_local_config(out / "prometheus", [f"{address(k)}:{SIDECAR_PORT}" for k in (0, 1)], "1s")
        data = out / "prometheus-data"
        shutil.rmtree(data, ignore_errors=True)  # an earlier run's series would still be within the lookback
        self.log = (out / "prometheus.log").open("w")
        self.proc = subprocess.Popen(
            in_node(0, "prometheus", f"--config.file={config}", f"--storage.tsdb.path={data}",
                    f"--web.listen-address={address(0)}:{PROMETHEUS_PORT}"),
            stdout=self.log, stderr=subprocess.STDOUT, start_new_session=True)

    def query(self, expr: str) -> list[dict]:
        from urllib.parse import quote

        code, text = http(0, "GET", f"http://{address(0)}:{PROMETHEUS_PORT}/api/v1/query?query={quote(expr)}")
        return json.loads(text)["data"]["result"] if code == 200 else []

    def stop(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(timeout=20)
        self.log.close()


def scraped(prom: Prometheus) -> dict:
    """What Prometheus saw once both sidecars exported their ranks (a few scrapes after the rounds)."""
    def labels(expr: str, *names: str) -> list[list[str]]:
        return sorted([r["metric"].get(n, "") for n in names] + [r["value"][1]] for r in prom.query(expr))

    # Prometheus's first scrape of a target comes up to several seconds after it starts, which on a fast link is
    # after the rounds are over: wait until both ranks' series are there, then a few scrapes more
    deadline = time.monotonic() + 60
    while len(prom.query("count by (rank) (gatherwise_logits_path_seconds_count)")) < 2 \
            and time.monotonic() < deadline:
        time.sleep(1)
    time.sleep(4)
    return {"up": labels('up{job="gatherwise-sidecar"}', "instance"),
            "ranks": labels("count by (rank) (gatherwise_logits_path_seconds_count)", "rank"),
            "controllers": labels('gatherwise_sidecar_role{role="controller"} == 1', "instance"),
            "observers": labels('gatherwise_sidecar_role{role="observer"} == 1', "instance")}


def run_auto(engine: Engine, token: str) -> dict:
    """Every bucket to the auto policy, the batch served for AUTO_SECONDS; what the controller decided."""
    puts = [http(0, "PUT", f"{sidecar(0)}/v1/policy", AUTO_POLICY, token)[0],
            http(0, "PUT", f"{sidecar(0)}/v1/mode?wait=0", {"mode": "auto"}, token)[0]]
    rounds = []
    deadline = time.monotonic() + AUTO_SECONDS
    while time.monotonic() < deadline:
        rounds.append(engine.generate(PROMPTS, MAX_TOKENS))
    decisions = get(0, f"{sidecar(0)}/v1/decisions?limit=256").get("decisions", [])
    return {"puts": puts, "rounds": rounds, "table": get(0, f"{sidecar(0)}/v1/policy/table").get("table", {}),
            "reasons": [d["reason"] for d in decisions], "switches": [d for d in decisions if d["reason"] == "auto"],
            "stats": get(0, f"{sidecar(0)}/v1/stats").get("stats", []),
            "observer_decisions": http(1, "GET", f"{sidecar(1)}/v1/decisions")}


def served(engine: Engine, model: str, plugin: bool, token: str, out: Path) -> dict:
    nodes = start_nodes(engine, model, plugin, token, out)
    prom: Prometheus | None = None
    try:
        wait_ready(engine, nodes)
        if not plugin:
            return {"tokens": engine.generate(PROMPTS, MAX_TOKENS)}
        prom = Prometheus(out)
        engine.generate(PROMPTS, MAX_TOKENS)  # the hooks install at the first step; the sidecars attach after it
        result: dict = {"engine": [wait_attached(k) for k in (0, 1)], "rounds": [], "puts": []}
        for mode in SCHEDULE:
            code, text = http(0, "PUT", f"{sidecar(0)}/v1/mode?wait=0", {"mode": mode}, token)
            result["puts"].append({"mode": mode, "status": code, "body": text[:300]})
            result["rounds"].append({"mode": mode, "tokens": engine.generate(PROMPTS, MAX_TOKENS)})
        result["observer_put"] = http(1, "PUT", f"{sidecar(1)}/v1/mode?wait=0", {"mode": "gather"}, token)
        result["scraped"] = scraped(prom)
        for k in (0, 1):
            result[f"metrics{k}"] = http(k, "GET", f"{sidecar(k)}/metrics")[1]  # before auto: the schedule's modes
        result["auto"] = run_auto(engine, token)
        for k in (0, 1):
            result[f"mode{k}"] = http(k, "GET", f"{sidecar(k)}/v1/mode")
            result[f"readyz{k}"] = http(k, "GET", f"{sidecar(k)}/readyz")
        return result
    finally:
        if prom is not None:
            prom.stop()
        for node in nodes:
            node.stop()


def generated(engine: Reference, mode: str, out: Path) -> list[list[int]]:
    """`gatherwise generate` across both nodes in `mode`; node 0's tokens."""
    nodes = [NodeProcess(k, "exec " + shlex.join(engine.generate_command(k, PROMPTS, MAX_TOKENS, mode)),
                         {**os.environ, **gloo_env(k)}, out / f"reference-generate-{mode}-node{k}.log")
             for k in (0, 1)]
    try:
        codes = [node.wait(timeout=600) for node in nodes]
    finally:
        for node in nodes:
            node.stop()
    text = (out / f"reference-generate-{mode}-node0.log").read_text()
    if codes != [0, 0]:
        raise RuntimeError(f"gatherwise generate --mode {mode} across the nodes exited {codes}: {text[-2000:]}")
    return json.loads(text.strip().splitlines()[-1])["tokens"]


def sweep(engine: Reference, out: Path, rows: str) -> int:
    """`gatherwise bench` with one rank on each node: node 0 writes OUT/sweep (results.json, crossover.png)."""
    nodes = [NodeProcess(k, "exec " + shlex.join(engine.sweep_command(k, str(out / "sweep"), rows)),
                         {**os.environ, **gloo_env(k)}, out / f"sweep-node{k}.log") for k in (0, 1)]
    try:
        codes = [node.wait(timeout=1800) for node in nodes]
    finally:
        for node in nodes:
            node.stop()
    print((out / "sweep-node0.log").read_text()[-3000:])
    return 0 if codes == [0, 0] else 1


def reference_tokens(engine: Reference, out: Path) -> dict:
    """The reference engine's tokens in each mode and a random switch schedule, across the nodes; all_gather is
    the plain engine (it is what the engine does without gatherwise choosing)."""
    by_mode = {mode: generated(engine, mode, out) for mode in ("all_gather", "gather", "sharded", "schedule:7")}
    return {"tokens": by_mode["all_gather"], "by_mode": by_mode}


@dataclass(frozen=True)
class Observed:
    """What a run saw: the plain engine's tokens, and with gatherwise the engine's rounds, the sidecars' answers,
    what Prometheus scraped and what the auto policy did."""

    plain: dict[str, Any]
    gw: dict[str, Any]

    def role(self, k: int) -> str | None:
        role: str | None = json.loads(self.gw[f"mode{k}"][1]).get("role")
        return role


CHECKS = Checks()  # each registers below, named after its function, in the order a run takes them


def two_node_check(predicate: Callable[[Observed], bool]) -> Callable[[Observed], bool]:
    """Registers `predicate` as the check of its name: it passes when the predicate holds of what the run saw."""
    def check(context: Context) -> Result:
        return {"status": "pass" if predicate(context["observed"]) else "fail"}

    check.__doc__ = predicate.__doc__
    CHECKS.check(predicate.__name__)(check)
    return predicate


@two_node_check
def tokens_equal_plain_in_every_round(run: Observed) -> bool:
    # a server engine's rounds carry tokens; the reference engine's tokens come from its generate runs
    rounds = [r["tokens"] for r in run.gw["rounds"] if r["tokens"]] + list(run.plain.get("by_mode", {}).values())
    return bool(rounds) and all(t == run.plain["tokens"] for t in rounds)


@two_node_check
def controller_accepted_every_switch(run: Observed) -> bool:
    return all(p["status"] in (200, 202) for p in run.gw["puts"])


@two_node_check
def both_sidecars_attached(run: Observed) -> bool:
    return all(e.get("attached") for e in run.gw["engine"])


@two_node_check
def each_sidecar_reads_its_nodes_rank(run: Observed) -> bool:
    return [e.get("ranks") for e in run.gw["engine"]] == [[0], [1]]


@two_node_check
def node_indices(run: Observed) -> bool:
    return [e.get("node_index") for e in run.gw["engine"]] == [0, 1]


@two_node_check
def roles(run: Observed) -> bool:
    return (run.role(0), run.role(1)) == ("controller", "observer")


@two_node_check
def observer_refuses_with_409(run: Observed) -> bool:
    return bool(run.gw["observer_put"][0] == 409)


@two_node_check
def both_ready(run: Observed) -> bool:
    return bool(run.gw["readyz0"][0] == run.gw["readyz1"][0] == 200)


@two_node_check
def each_node_exports_its_rank_only(run: Observed) -> bool:
    return all(f'rank="{k}"' in run.gw[f"metrics{k}"] and f'rank="{1 - k}"' not in run.gw[f"metrics{k}"]
               for k in (0, 1))


@two_node_check
def every_mode_ran_on_both_nodes(run: Observed) -> bool:
    return all(modes_run(run.gw[f"metrics{k}"]) >= set(SCHEDULE) for k in (0, 1))


@two_node_check
def prometheus_scraped_both_sidecars(run: Observed) -> bool:
    return [u[1] for u in run.gw["scraped"]["up"]] == ["1", "1"]


@two_node_check
def prometheus_sees_both_ranks(run: Observed) -> bool:
    return [r[0] for r in run.gw["scraped"]["ranks"]] == ["0", "1"]


@two_node_check
def prometheus_one_controller_one_observer(run: Observed) -> bool:
    scraped = run.gw["scraped"]
    return ([c[0] for c in scraped["controllers"]] == [f"{address(0)}:{SIDECAR_PORT}"]
            and [o[0] for o in scraped["observers"]] == [f"{address(1)}:{SIDECAR_PORT}"])


@two_node_check
def auto_accepted_on_controller(run: Observed) -> bool:
    return all(code in (200, 202) for code in run.gw["auto"]["puts"])


@two_node_check
def auto_tokens_equal_plain(run: Observed) -> bool:
    return all(tokens == run.plain["tokens"] for tokens in run.gw["auto"]["rounds"] if tokens)


@two_node_check
def auto_probed_on_controller(run: Observed) -> bool:
    return "probe" in run.gw["auto"]["reasons"]


@two_node_check
def auto_chose_a_mode_for_the_bucket(run: Observed) -> bool:
    return run.gw["auto"]["table"].get(BUCKET) in ("all_gather", "gather", "sharded")


@two_node_check
def observer_runs_no_policy(run: Observed) -> bool:
    code, text = run.gw["auto"]["observer_decisions"]
    return code == 409 or not json.loads(text or "{}").get("decisions")


def checked(plain: dict, gw: dict) -> dict[str, Result]:
    """Every check's result: a check that raised (an answer missing from what the run saw) is an error, a failure."""
    return run_checks(CHECKS, {"observed": Observed(plain, gw)}, budget=Budget(math.inf))


def path_ms(metrics: str) -> dict[str, float]:
    """Mean logits path per call of each mode, in ms, on the rank a sidecar reads (the sum and count series)."""
    sums: dict[str, dict[str, float]] = {"sum": {}, "count": {}}
    for line in metrics.splitlines():
        for kind, per_mode in sums.items():
            if line.startswith(f"gatherwise_logits_path_seconds_{kind}{{"):
                mode = line.split('mode="', 1)[1].split('"', 1)[0]
                per_mode[mode] = per_mode.get(mode, 0.0) + float(line.rsplit(" ", 1)[1])
    return {m: 1e3 * sums["sum"][m] / n for m, n in sums["count"].items() if n > 0}


def modes_run(metrics: str) -> set[str]:
    """The modes with logits calls in a sidecar's exposition (gatherwise_logits_path_seconds_count > 0)."""
    return set(path_ms(metrics))


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m tests.machine.two_node", description=(__doc__ or "").split("\n\n")[0])
    p.add_argument("--engine", choices=sorted(ENGINES), default="sglang")
    p.add_argument("--model", help="checkpoint directory (default: a tiny Llama built here)")
    p.add_argument("--out", type=Path, default=Path("out/two_node"))
    p.add_argument("--rate", help="limit the link between the nodes to this rate (tc htb, e.g. 100mbit)")
    p.add_argument("--sweep", metavar="ROWS", help="instead of the checks: `gatherwise bench` across the nodes at "
                   "these batch rows (e.g. 1,4,16,64; the reference engine only)")
    p.add_argument("--list", action="store_true", help="name the checks, in the order they run, and exit")
    args = p.parse_args(argv)
    if args.list:
        print(list_checks(CHECKS))
        return 0
    if args.sweep and args.engine != "reference":
        p.error("--sweep runs gatherwise bench: only with --engine reference")
    if os.geteuid() != 0:
        print("tests.machine.two_node needs root (network and mount namespaces)", file=sys.stderr)
        return 2
    engine = ENGINES[args.engine]
    out = args.out.resolve()
    out.mkdir(parents=True, exist_ok=True)
    model = args.model or str(out / "tiny-llama")
    if not args.model and not isinstance(engine, Reference) and not (Path(model) / "config.json").exists():
        subprocess.run([engine.python, str(ROOT / "scripts" / "tiny_checkpoint.py"), model, "--for-engines"],
                       check=True, capture_output=True)
    token = secrets.token_hex(16)
    busy = in_use()  # the namespace names are fixed: setting up would tear another run's nodes down under it
    if busy:
        print(f"namespaces {', '.join(busy)} are in use by another two-node run; wait for it to end", file=sys.stderr)
        return 2
    set_up_network()
    if args.rate:
        limit_link(args.rate)
    try:
        if args.sweep:
            assert isinstance(engine, Reference)
            return sweep(engine, out, args.sweep)
        if isinstance(engine, Reference):
            plain = reference_tokens(engine, out)
        else:
            plain = served(engine, model, False, token, out)
        gw = served(engine, model, True, token, out)
    finally:
        tear_down_network()
    paths = {f"node{k}": path_ms(gw[f"metrics{k}"]) for k in (0, 1)}
    auto = gw["auto"]
    results = checked(plain, gw)
    passed = {name: r["status"] == "pass" for name, r in results.items()}
    result = {"engine": engine.name, "checks": passed, "rate": args.rate, "rows": len(PROMPTS),
              "logits_path_ms": paths, "auto_choice": auto["table"].get(BUCKET), "plain": plain, "gatherwise": gw}
    (out / f"two_node-{engine.name}.json").write_text(json.dumps(result, indent=1))
    for name, ok in passed.items():
        error = results[name].get("error")
        print(f"{'ok  ' if ok else 'FAIL'} {engine.name}: {name}" + (f" ({error})" if error else ""))
    link = args.rate or "unlimited"
    for node, per_mode in paths.items():
        print(f"{engine.name} {node} logits path per call (ms, {len(PROMPTS)} rows, link {link}): "
              + ", ".join(f"{m} {v:.2f}" for m, v in sorted(per_mode.items())))
    print(f"{engine.name} auto (link {link}): bucket {BUCKET} -> {result['auto_choice']}, "
          f"{len(auto['switches'])} switch(es), {auto['reasons'].count('probe')} probe decision(s), "
          f"{len(auto['rounds'])} batches")
    return 0 if all(result["checks"].values()) else 1


if __name__ == "__main__":
    sys.exit(main())
