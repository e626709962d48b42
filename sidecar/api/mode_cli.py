"""`gatherwise mode get` / `gatherwise mode set <mode>|auto [--buckets 1,2,4] [--wait S]`: get or set the logits
mode through the sidecar's HTTP API.

Options go before or after the subcommand (`gatherwise mode --url U get --json` and `gatherwise mode get --url U
--json` are the same).

<mode> is any implemented mode (gatherwise.modes.IMPLEMENTED: all_gather, gather, sharded).

Talks to the sidecar's HTTP API (docs/api.md). The token comes from --token or env GATHERWISE_API_TOKEN.
Exit status: 0 done, 1 not applied within --wait (202), 2 usage or request refused (4xx), 3 sidecar unreachable.
"""

from __future__ import annotations

import argparse
import json
import os
import sys

import httpx

from gatherwise.modes import IMPLEMENTED_LABELS

DEFAULT_URL = "http://127.0.0.1:9400"


def parse_bucket_list(text: str) -> list[int]:
    try:
        values = [int(part) for part in text.split(",") if part.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"--buckets takes bucket upper bounds like 1,2,4, got {text!r}") from None
    if not values:
        raise argparse.ArgumentTypeError("--buckets needs at least one bucket")
    return values


def _options(parser: argparse.ArgumentParser, names: tuple[str, ...], *, defaults: bool) -> None:
    """The options of `names` on `parser`. Each is accepted before and after the subcommand, since users put them
    in either place; only the top-level parser holds defaults, so an option given before the subcommand is not
    overwritten by a default after it."""
    def default(value: object) -> object:
        return value if defaults else argparse.SUPPRESS

    if "--url" in names:
        parser.add_argument("--url", default=default(os.environ.get("GATHERWISE_URL", DEFAULT_URL)),
                            help=f"sidecar base URL (default: env GATHERWISE_URL or {DEFAULT_URL})")
    if "--token" in names:
        parser.add_argument("--token", default=default(os.environ.get("GATHERWISE_API_TOKEN")),
                            help="API token for `set` (default: env GATHERWISE_API_TOKEN)")
    if "--wait" in names:
        parser.add_argument("--wait", type=float, default=default(5.0),
                            help="seconds `set` waits until every rank switched (default 5)")
    if "--json" in names:
        parser.add_argument("--json", action="store_true", default=default(False),
                            help="print the sidecar's JSON answer instead of the summary")


GET_OPTIONS = ("--url", "--json")
SET_OPTIONS = ("--url", "--token", "--wait", "--json")


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="gatherwise mode", description="Get or set the logits mode via the sidecar.")
    _options(p, SET_OPTIONS, defaults=True)
    sub = p.add_subparsers(dest="command", required=True)
    get = sub.add_parser("get", help="show the active and requested table, policy, epoch and call index")
    _options(get, GET_OPTIONS, defaults=False)
    s = sub.add_parser("set", help="pin buckets to a mode, or release them to the auto policy")
    s.add_argument("mode", choices=[*IMPLEMENTED_LABELS, "auto"])
    s.add_argument("--buckets", type=parse_bucket_list, help="comma-separated bucket upper bounds (default: all)")
    _options(s, SET_OPTIONS, defaults=False)
    return p


def mode_letter(mode: str) -> str:
    """One letter per mode in the compact table: A all_gather, G gather, S sharded."""
    return mode[:1].upper()


def format_table(table: dict[str, str]) -> str:
    return " ".join(f"{bucket}:{mode_letter(mode)}" for bucket, mode in table.items())


def describe(state: dict) -> str:
    lines = [f"engine    {state['engine']}  policy {state['policy']}  epoch {state['epoch']}  "
             f"call {state['call_index']}",
             f"active    {format_table(state['active'])}  (since call {state['apply_call']})"]
    if state["pending"]:
        lines.append(f"requested {format_table(state['requested'])}  (pending, seq {state['requested_seq']})")
    if state["pinned"]:
        lines.append(f"pinned    {format_table(state['pinned'])}")
    legend = ", ".join(f"{mode_letter(m)} = {m}" for m in IMPLEMENTED_LABELS)
    lines.append(f"({legend}; buckets are batch-size upper bounds)")
    return "\n".join(lines)


def error_text(response: httpx.Response) -> str:
    try:
        detail = response.json().get("detail")
    except ValueError:
        detail = response.text
    if isinstance(detail, list):  # FastAPI validation errors
        detail = "; ".join(f"{'.'.join(map(str, e.get('loc', [])))}: {e.get('msg')}" for e in detail)
    return f"HTTP {response.status_code}: {detail}"


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(sys.argv[1:] if argv is None else argv)
    url = args.url.rstrip("/")
    try:
        with httpx.Client(base_url=url, timeout=(args.wait + 10.0) if args.command == "set" else 10.0) as client:
            if args.command == "get":
                r = client.get("/v1/mode")
                if r.status_code != 200:
                    print(f"gatherwise mode get: {error_text(r)}", file=sys.stderr)
                    return 2
                print(json.dumps(r.json(), indent=2) if args.json else describe(r.json()))
                return 0
            if not args.token:
                print("gatherwise mode set: no API token: pass --token or set GATHERWISE_API_TOKEN",
                      file=sys.stderr)
                return 2
            body = {"mode": args.mode, **({"buckets": args.buckets} if args.buckets else {})}
            r = client.put("/v1/mode", json=body, params={"wait": args.wait},
                           headers={"Authorization": f"Bearer {args.token}"})
    except httpx.HTTPError as exc:
        print(f"gatherwise mode: cannot reach the sidecar at {url}: {exc}", file=sys.stderr)
        return 3
    if r.status_code not in (200, 202):
        print(f"gatherwise mode set: {error_text(r)}", file=sys.stderr)
        return 2
    result = r.json()
    if args.json:
        print(json.dumps(result, indent=2))
    elif r.status_code == 200:
        print(f"applied: every rank runs the new table from call {result['apply_call']} (seq {result['seq']})")
        print(describe(result["state"]))
    else:
        print(f"not applied within {args.wait}s (seq {result['seq']}, engine at call "
              f"{result['state']['call_index']}); it applies at the engine's next call", file=sys.stderr)
    return 0 if r.status_code == 200 else 1
