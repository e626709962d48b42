"""The sidecar's durable decision state: an AutoPolicy <-> JSON, and an atomic file next to the control block.

Why a JSON file and not a fixed area in the control block: the engine never reads this state, it is variable in
size (decision log, sample windows), and only the sidecar writes it. Keeping it out of the block keeps the
block's ABI small and the engine's hot path oblivious. The file lives in the engine's directory
(`<shm_dir>/<engine id>/sidecar-state.json`), so an engine restart (new id, new directory) starts fresh and old
state is never mixed in, and rank 0 removes it with the directory. It is written to a fresh 0600 temporary file
(O_CREAT|O_EXCL|O_NOFOLLOW: a planted file or symlink under that name is never written through) and renamed, so a
sidecar killed mid-write leaves the previous complete file; it is read without following links and only up to
MAX_STATE_BYTES. What the engine is really running (active
table, epoch, last command) is always taken from the control block itself, never from this file.
"""

from __future__ import annotations

import dataclasses
import json
from collections import deque
from typing import Any

from gatherwise.modes import Mode, ModeTable
from gatherwise.shm_format.private_files import read_small_file, write_private_file
from sidecar.policy import PAIRS_KEPT, AutoPolicy, Decision, Pair, PolicyParams, Probe

_DECISION_FIELDS = dataclasses.fields(Decision)
STATE_VERSION = 2  # 2: probes, their times and back-off per (bucket, mode)
MAX_STATE_BYTES = 64 << 20  # far above what the bounded decision log and sample windows produce


def _key(bucket: int, mode: Mode) -> str:
    return f"{bucket}:{mode.label}"


def _parse_key(key: str) -> tuple[int, Mode]:
    bucket, label = key.split(":")
    return int(bucket), Mode.parse(label)


def policy_to_json(policy: AutoPolicy, extra: dict[str, Any] | None = None) -> str:
    doc = {
        "version": STATE_VERSION,
        "params": dataclasses.asdict(policy.params),
        "choice": [m.label for m in policy.choice],
        "pins": {str(b): m.label for b, m in policy.pins.items()},
        "last_switch": {str(b): t for b, t in policy.last_switch.items()},
        "last_probe": {_key(b, m): t for (b, m), t in policy.last_probe.items()},
        "backoff": {_key(b, m): f for (b, m), f in policy.backoff.items()},
        "backoff_reference": {str(b): v for b, v in policy.backoff_reference.items()},
        "pairs": {str(b): [[p.time, p.probed.label, p.reference.label, p.ratio] for p in v]
                  for b, v in policy.pairs.items() if v},
        "probe": None if policy.probe is None else {"bucket": policy.probe.bucket, "mode": policy.probe.mode.label,
                                                    "started": policy.probe.started, "calls": policy.probe.calls},
        "calls_total": policy.calls_total,
        "probe_calls_used": policy.probe_calls_used,
        "next_decision_id": policy.next_decision_id,
        # shallow: a decision's evidence is plain JSON already (asdict's deep copy cost more than the encoding)
        "decisions": [{f.name: getattr(d, f.name) for f in _DECISION_FIELDS} for d in policy.decisions],
        "estimates": policy.estimates.to_json(),
        "extra": extra or {},
    }
    return json.dumps(doc, separators=(",", ":"))


def policy_from_json(text: str) -> AutoPolicy:
    """Rebuild a policy; any problem is a ValueError (the caller then starts from the control block alone)."""
    try:
        doc = json.loads(text)
        if not isinstance(doc, dict) or doc.get("version") != STATE_VERSION:
            raise ValueError(f"state version {doc.get('version') if isinstance(doc, dict) else None!r}, "
                             f"expected {STATE_VERSION}")
        params = PolicyParams(**doc["params"])
        choice = ModeTable(tuple(Mode.parse(m) for m in doc["choice"]))
        policy = AutoPolicy(params, choice, auto=True)
        policy.pins = {int(b): Mode.parse(m) for b, m in doc["pins"].items()}
        policy.last_switch = {int(b): float(t) for b, t in doc["last_switch"].items()}
        policy.last_probe = {_parse_key(k): float(t) for k, t in doc["last_probe"].items()}
        policy.backoff = {_parse_key(k): float(f) for k, f in doc["backoff"].items()}
        policy.backoff_reference = {int(b): float(v) for b, v in doc["backoff_reference"].items()}
        policy.pairs = {int(b): deque((Pair(float(t), Mode.parse(m), Mode.parse(ref), float(r)) for t, m, ref, r in v),
                                      maxlen=PAIRS_KEPT) for b, v in doc["pairs"].items()}
        probe = doc["probe"]
        policy.probe = None if probe is None else Probe(int(probe["bucket"]), Mode.parse(probe["mode"]),
                                                        float(probe["started"]), int(probe["calls"]))
        policy.calls_total, policy.probe_calls_used = int(doc["calls_total"]), int(doc["probe_calls_used"])
        policy.next_decision_id = int(doc["next_decision_id"])
        policy.decisions.extend(Decision(**d) for d in doc["decisions"])
        policy.estimates.load_json(doc["estimates"])
        policy.restored_extra = doc.get("extra") or {}
        return policy
    except (KeyError, TypeError, AttributeError, json.JSONDecodeError) as exc:
        raise ValueError(f"unreadable sidecar state: {exc!r}") from None


def save_state(path: str, text: str) -> None:
    write_private_file(path, text.encode())


def load_state(path: str) -> str | None:
    """The saved text, or None when there is none. OSError/ValueError for a file that is not ours to read
    (a symlink, a FIFO, too large) or not UTF-8; the caller then starts from the control block alone."""
    try:
        return read_small_file(path, MAX_STATE_BYTES).decode()
    except FileNotFoundError:
        return None
