"""SGLang TP=2 across two "nodes" on this Linux host, plain and with gatherwise, each node with its own sidecar.

    sudo .venv-sglang/bin/python scripts/two_node.py --out out/two_node      # root: namespaces and mounts

A node is a network namespace (`ip netns`) joined to the other by a veth pair, with its own private `/dev/shm`
(a mount namespace, `unshare -m`, and a tmpfs): what two hosts look like to the engine and to gatherwise. Node k
runs SGLang's `launch_server --tp 2 --nnodes 2 --node-rank k` (one TP rank each; rank 0, the gather root and the
control block, on node 0) with gloo over the veth (`GLOO_SOCKET_IFNAME`) and `SGLANG_HOST_IP` set to the node's
address (without it SGLang stalls at "Can not get local ip by remote": docs/deployment.md), and, with gatherwise,
a `gatherwise sidecar` beside it on the node's shm_dir.

The run: greedy requests through node 0's HTTP server, first on the plain engine, then with the plugin while the
controller (node 0's sidecar) switches the table all_gather -> gather -> sharded -> all_gather between them. It
checks that the tokens are the plain engine's, that both sidecars attached to their node's rank (node file,
partial attach), that node 0's is the controller and node 1's an observer (409 on a mutation, the role on
/v1/mode, /readyz and gatherwise_sidecar_role), and that each exports its rank's series. Writes OUT/two_node.json;
exit status 0 when every check passed. Everything it creates (namespaces, veths, mounts, processes) is gone when
it ends.
"""

from __future__ import annotations

import argparse
import json
import os
import secrets
import shlex
import signal
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
NODES = (("gw-node0", "gw-veth0", "10.77.0.1"), ("gw-node1", "gw-veth1", "10.77.0.2"))
ENGINE_PORT, SIDECAR_PORT, DIST_PORT = 30000, 9400, 29500
PROMPTS = [[1, 15, 27, 99, 4000, 12], [7, 8], [31000, 5, 5, 5, 17, 23], [2]]
MAX_TOKENS = 12
SCHEDULE = ("all_gather", "gather", "sharded", "all_gather")  # the table before each round of requests
SHM_DIR = "/dev/shm/gatherwise"


def run(*cmd: str, check: bool = True) -> subprocess.CompletedProcess:
    return subprocess.run(cmd, check=check, capture_output=True, text=True)


def in_node(node: int, *cmd: str) -> list[str]:
    return ["ip", "netns", "exec", NODES[node][0], *cmd]


def set_up_network() -> None:
    tear_down_network()
    for ns, _, _ in NODES:
        run("ip", "netns", "add", ns)
    run("ip", "link", "add", NODES[0][1], "type", "veth", "peer", "name", NODES[1][1])
    for ns, veth, addr in NODES:
        run("ip", "link", "set", veth, "netns", ns)
        run(*in_node(NODES.index((ns, veth, addr)), "ip", "addr", "add", f"{addr}/24", "dev", veth))
        run("ip", "-n", ns, "link", "set", veth, "up")
        run("ip", "-n", ns, "link", "set", "lo", "up")


def limit_link(rate: str) -> None:
    """Both directions of the veth pair at `rate` (tc's units, e.g. 100mbit): an htb class every packet takes."""
    for k, (_, veth, _) in enumerate(NODES):
        run(*in_node(k, "tc", "qdisc", "add", "dev", veth, "root", "handle", "1:", "htb", "default", "10"))
        run(*in_node(k, "tc", "class", "add", "dev", veth, "parent", "1:", "classid", "1:10", "htb", "rate", rate))


def tear_down_network() -> None:
    for ns, _, _ in NODES:
        run("ip", "netns", "del", ns, check=False)  # takes its veth end (and so the pair) with it


def http(node: int, method: str, url: str, body: dict | None = None, token: str | None = None,
         timeout: float = 60.0) -> tuple[int, str]:
    """One request from inside the node's namespace (curl): (status, body)."""
    cmd = ["curl", "-s", "-o", "-", "-w", "\n%{http_code}", "-X", method, "--max-time", str(timeout), url]
    if body is not None:
        cmd += ["-H", "Content-Type: application/json", "-d", json.dumps(body)]
    if token:
        cmd += ["-H", f"Authorization: Bearer {token}"]
    out = run(*in_node(node, *cmd), check=False).stdout
    text, _, code = out.rpartition("\n")
    return int(code or 0), text


class Node:
    """One node's processes: SGLang's node k and, with gatherwise, a sidecar; in their own mount namespace."""

    def __init__(self, k: int, python: str, model: str, plugin: bool, token: str, log_dir: Path) -> None:
        _, veth, addr = NODES[k]
        env = {**os.environ, "SGLANG_USE_CPU_ENGINE": "1", "SGLANG_CPU_OMP_THREADS_BIND": str(k),
               "SGLANG_NCCL_SO_PATH": "/nonexistent/libnccl.so", "OMP_WAIT_POLICY": "PASSIVE",
               "GLOO_SOCKET_IFNAME": veth, "SGLANG_HOST_IP": addr, "GATHERWISE_API_TOKEN": token}
        env.pop("GATHERWISE_ENABLE", None)
        if plugin:
            env.update(GATHERWISE_ENABLE="1", GATHERWISE_ENGINE_SHM_DIR=SHM_DIR)
        engine = [python, "-m", "sglang.launch_server", "--model-path", model, "--tp", "2", "--nnodes", "2",
                  "--node-rank", str(k), "--dist-init-addr", f"{NODES[0][2]}:{DIST_PORT}", "--host", addr,
                  "--port", str(ENGINE_PORT), "--device", "cpu", "--attention-backend", "torch_native",
                  "--disable-cuda-graph", "--dtype", "float32", "--mem-fraction-static", "0.15",
                  "--max-total-tokens", "4096", "--context-length", "256", "--skip-tokenizer-init",
                  "--random-seed", "1234", "--log-level", "warning"]
        sidecar = [str(Path(python).parent / "gatherwise"), "sidecar", "--host", addr, "--port", str(SIDECAR_PORT),
                   "--shm-dir", SHM_DIR]
        script = "mount -t tmpfs tmpfs /dev/shm && "
        if plugin:
            script += f"{shlex.join(sidecar)} > {shlex.quote(str(log_dir / f'sidecar{k}.log'))} 2>&1 & "
        script += f"exec {shlex.join(engine)}"
        self.log = open(log_dir / f"{'gw' if plugin else 'plain'}-node{k}.log", "w")
        self.proc = subprocess.Popen(in_node(k, "unshare", "-m", "--propagation", "private", "sh", "-c", script),
                                     env=env, stdout=self.log, stderr=subprocess.STDOUT, start_new_session=True)

    def stop(self) -> None:
        try:
            os.killpg(self.proc.pid, signal.SIGTERM)
            self.proc.wait(timeout=30)
        except (ProcessLookupError, subprocess.TimeoutExpired):
            try:
                os.killpg(self.proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        self.log.close()


def wait_ready(deadline_s: float = 600.0) -> None:
    url = f"http://{NODES[0][2]}:{ENGINE_PORT}/health_generate"
    deadline = time.monotonic() + deadline_s
    while time.monotonic() < deadline:
        if http(0, "GET", url, timeout=10)[0] == 200:
            return
        time.sleep(2)
    raise RuntimeError(f"node 0's server did not answer {url} within {deadline_s:.0f} s")


def generate() -> list[list[int]]:
    """The prompts as one batched request (SGLang's /generate with a list of prompts): steps of len(PROMPTS) rows."""
    code, text = http(0, "POST", f"http://{NODES[0][2]}:{ENGINE_PORT}/generate",
                      {"input_ids": PROMPTS, "sampling_params": {"temperature": 0.0, "max_new_tokens": MAX_TOKENS,
                                                                 "ignore_eos": True}})
    if code != 200:
        raise RuntimeError(f"/generate answered {code}: {text[:300]}")
    return [out["output_ids"] for out in json.loads(text)]


def sidecar(k: int) -> str:
    return f"http://{NODES[k][2]}:{SIDECAR_PORT}"


def wait_attached(k: int, deadline_s: float = 60.0) -> dict:
    deadline = time.monotonic() + deadline_s
    while True:
        code, text = http(k, "GET", f"{sidecar(k)}/v1/engine", timeout=10)
        info = json.loads(text) if code == 200 else {}
        if info.get("attached") or time.monotonic() > deadline:
            return info
        time.sleep(1)


def served(python: str, model: str, plugin: bool, token: str, log_dir: Path) -> dict:
    nodes = [Node(k, python, model, plugin, token, log_dir) for k in (0, 1)]
    try:
        wait_ready()
        if not plugin:
            return {"tokens": generate()}
        generate()  # the hooks install at the first step; the sidecars attach after it
        result: dict = {"engine": [wait_attached(k) for k in (0, 1)], "rounds": [], "puts": []}
        for mode in SCHEDULE:
            code, text = http(0, "PUT", f"{sidecar(0)}/v1/mode?wait=0", {"mode": mode}, token)
            result["puts"].append({"mode": mode, "status": code, "body": text[:300]})
            result["rounds"].append({"mode": mode, "tokens": generate()})
        result["observer_put"] = http(1, "PUT", f"{sidecar(1)}/v1/mode?wait=0", {"mode": "gather"}, token)
        for k in (0, 1):
            result[f"mode{k}"] = http(k, "GET", f"{sidecar(k)}/v1/mode")
            result[f"readyz{k}"] = http(k, "GET", f"{sidecar(k)}/readyz")
            result[f"metrics{k}"] = http(k, "GET", f"{sidecar(k)}/metrics")[1]
        return result
    finally:
        for node in nodes:
            node.stop()


def checks(plain: dict, gw: dict) -> dict[str, bool]:
    mode0, mode1 = (json.loads(gw[f"mode{k}"][1]) for k in (0, 1))
    return {
        "tokens_equal_plain_in_every_round": all(r["tokens"] == plain["tokens"] for r in gw["rounds"]),
        "controller_accepted_every_switch": all(p["status"] in (200, 202) for p in gw["puts"]),
        "both_sidecars_attached": all(e.get("attached") for e in gw["engine"]),
        "each_sidecar_reads_its_nodes_rank": [e.get("ranks") for e in gw["engine"]] == [[0], [1]],
        "node_indices": [e.get("node_index") for e in gw["engine"]] == [0, 1],
        "roles": (mode0.get("role"), mode1.get("role")) == ("controller", "observer"),
        "observer_refuses_with_409": gw["observer_put"][0] == 409,
        "both_ready": gw["readyz0"][0] == gw["readyz1"][0] == 200,
        "each_node_exports_its_rank_only": all(f'rank="{k}"' in gw[f"metrics{k}"] and f'rank="{1 - k}"' not in
                                               gw[f"metrics{k}"] for k in (0, 1)),
        "every_mode_ran_on_both_nodes": all(modes_run(gw[f"metrics{k}"]) >= set(SCHEDULE) for k in (0, 1)),
    }


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
    ran = set()
    for line in metrics.splitlines():
        if line.startswith("gatherwise_logits_path_seconds_count{") and float(line.rsplit(" ", 1)[1]) > 0:
            ran.add(line.split('mode="', 1)[1].split('"', 1)[0])
    return ran


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--python", default=str(REPO / ".venv-sglang" / "bin" / "python"))
    p.add_argument("--model", help="checkpoint directory (default: a tiny Llama built here)")
    p.add_argument("--out", type=Path, default=Path("out/two_node"))
    p.add_argument("--rate", help="limit the link between the nodes to this rate (tc htb, e.g. 100mbit)")
    args = p.parse_args()
    if os.geteuid() != 0:
        print("two_node.py needs root (network and mount namespaces)", file=sys.stderr)
        return 2
    args.out.mkdir(parents=True, exist_ok=True)
    model = args.model or str(args.out / "tiny-llama")
    if not args.model and not (Path(model) / "config.json").exists():
        subprocess.run([args.python, str(REPO / "scripts" / "tiny_checkpoint.py"), model, "--for-engines"],
                       check=True, capture_output=True)
    token = secrets.token_hex(16)
    set_up_network()
    if args.rate:
        limit_link(args.rate)
    try:
        plain = served(args.python, model, False, token, args.out)
        gw = served(args.python, model, True, token, args.out)
    finally:
        tear_down_network()
    paths = {f"node{k}": path_ms(gw[f"metrics{k}"]) for k in (0, 1)}
    result = {"checks": checks(plain, gw), "rate": args.rate, "rows": len(PROMPTS), "logits_path_ms": paths,
              "plain": plain, "gatherwise": gw}
    (args.out / "two_node.json").write_text(json.dumps(result, indent=1))
    for name, ok in result["checks"].items():
        print(f"{'ok  ' if ok else 'FAIL'} {name}")
    for node, per_mode in paths.items():
        print(f"{node} logits path per call (ms, {len(PROMPTS)} rows, link {args.rate or 'unlimited'}): "
              + ", ".join(f"{m} {v:.2f}" for m, v in sorted(per_mode.items())))
    return 0 if all(result["checks"].values()) else 1


if __name__ == "__main__":
    sys.exit(main())
