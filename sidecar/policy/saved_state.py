"""The sidecar's durable decision state: a ModePolicy <-> JSON, and an atomic file next to the control block.

Why a JSON file and not a fixed area in the control block: the engine never reads this state, it is variable in
size (decision log, sample windows), and only the sidecar writes it. Keeping it out of the block keeps the
block's ABI small and the engine's hot path oblivious. The file lives in the engine's directory
(`<shm_dir>/<engine id>/sidecar-state.json`), so an engine restart (new id, new directory) starts fresh and old
state is never mixed in, and rank 0 removes it with the directory. It is written to a fresh 0600 temporary file
(O_CREAT|O_EXCL|O_NOFOLLOW: a planted file or symlink under that name is never written through) and renamed, so a
sidecar killed mid-write leaves the previous complete file; it is read without following links and only up to
MAX_STATE_BYTES. What the engine is really running (active table, epoch, last command) is always taken from the
control block itself, never from this file.

The document is the pydantic model PolicyState: reading validates every field (types, bucket ranges, mode
labels, parameter ranges), so a damaged or foreign file is refused with the field it failed on.
"""

from __future__ import annotations

from collections import deque
from typing import Annotated, Any, Literal

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, ValidationError, model_validator

from gatherwise.bounded_yaml import short
from gatherwise.config import ModeLabel, PolicyParams
from gatherwise.modes import IMPLEMENTED_LABELS, NUM_BUCKETS, Mode, ModeTable
from gatherwise.shm_format.private_files import read_small_file, write_private_file
from gatherwise.sidecar.policy.auto_choice import PAIRS_KEPT
from gatherwise.sidecar.policy.decision_log import REASONS, Decision
from gatherwise.sidecar.policy.estimates import KindMix
from gatherwise.sidecar.policy.mode_policy import ModePolicy
from gatherwise.sidecar.policy.paired_evidence import Pair
from gatherwise.sidecar.policy.pins import Pins
from gatherwise.sidecar.policy.probes import Probe
from gatherwise.validation_errors import dotted_location, error_text, joined_errors

# 2: probes, their times and back-off per (bucket, mode); 3: call kinds (pairs per kind, kind windows, the
# traffic mix, probe cost in seconds). A version 2 file is read (its pairs as kind 0) and written back as 3.
STATE_VERSION = 3
READ_VERSIONS = (2, 3)
# What a sidecar writes with the default window is ~0.1-0.5 MB (decision log, pairs, sample windows). The cap is
# what a file may hold, read or written: the whole file is parsed at attach, on the thread every request and
# scrape waits for (a parse holds the GIL wherever it runs), so its size is what that pause costs (~0.05 s per MB
# on an idle core, several times that on a loaded one). A state that would be larger is written without its sample
# windows (what a restart relearns fastest); a larger file is not read.
MAX_STATE_BYTES = 4 << 20

Bucket = Annotated[int, Field(ge=0, lt=NUM_BUCKETS)]
BucketMode = Annotated[str, Field(pattern=r"^\d+:[a-z_]+$", description='"<bucket index>:<mode label>"')]


class ProbeState(BaseModel):
    model_config = ConfigDict(extra="forbid")
    bucket: Bucket
    mode: ModeLabel
    started: float
    calls: int = Field(ge=0)
    samples: dict[int, list[float]] = Field(default_factory=dict)  # kind -> seconds of the probe's calls
    references: dict[int, list[float]] = Field(default_factory=dict)
    extra: float = 0.0  # its calls' seconds beyond the running mode's cost so far, signed


def _switch_key(key: str) -> str:
    """A gatherwise_mode_switches_total series saved as "<from mode>|<to mode>|<reason>"."""
    parts = key.split("|")
    if len(parts) != 3 or not all(label in IMPLEMENTED_LABELS for label in parts[:2]) or parts[2] not in REASONS:
        raise ValueError(f"switch count key {short(key)} is not '<mode>|<mode>|<reason>' (modes "
                         f"{', '.join(IMPLEMENTED_LABELS)}; reasons {', '.join(REASONS)})")
    return key


class SessionExtra(BaseModel):
    """What the control session saves with the policy (gatherwise.sidecar.control.session_store)."""

    model_config = ConfigDict(extra="forbid", strict=True)
    last_call_index: int = Field(-1, ge=-1, lt=1 << 63, description="newest call fed to the policy")
    switch_counts: dict[Annotated[str, AfterValidator(_switch_key)], Annotated[int, Field(ge=0, lt=1 << 63)]] = \
        Field(default_factory=dict, description="gatherwise_mode_switches_total per series, to continue it")


class PolicyState(BaseModel):
    """The file's document. Times are the sidecar's monotonic clock, except a decision's (unix seconds)."""

    model_config = ConfigDict(extra="forbid")
    version: Literal[2, 3]
    params: PolicyParams
    choice: list[ModeLabel] = Field(min_length=NUM_BUCKETS, max_length=NUM_BUCKETS)
    pins: dict[Bucket, ModeLabel]
    last_switch: dict[Bucket, float]
    last_probe: dict[BucketMode, float]
    backoff: dict[BucketMode, float]  # probe interval factor per (bucket, mode)
    backoff_reference: dict[Bucket, float]
    # (time, probed, reference, ratio[, kind, log se, calls]): version 2 wrote the first four
    pairs: dict[Bucket, list[tuple[float, ModeLabel, ModeLabel, float]
                             | tuple[float, ModeLabel, ModeLabel, float, int, float, int]]]
    probe: ProbeState | None
    calls_total: int = Field(ge=0)
    probe_calls_used: int = Field(ge=0)
    next_decision_id: int = Field(ge=1)
    decisions: list[Decision]
    estimates: dict[BucketMode, list[tuple[float, float]]]  # (time, seconds) samples per (bucket, mode)
    # (time, seconds) per "<bucket * 16 + kind>:<mode>": by (bucket, call kind) and the mode the table named
    kind_estimates: dict[BucketMode, list[tuple[float, float]]] = Field(default_factory=dict)
    mix: dict[Bucket, list[Annotated[int, Field(ge=0, lt=16)]]] = Field(default_factory=dict)
    seconds_total: float = Field(0.0, ge=0.0)
    probe_extra_seconds: float = Field(0.0, ge=0.0)
    last_probe_end: dict[Bucket, float] = Field(default_factory=dict)
    extra: SessionExtra = Field(default_factory=SessionExtra)

    @model_validator(mode="before")
    @classmethod
    def _version_first(cls, doc: Any) -> Any:
        """Another version is refused as such, not with the field errors that follow from it."""
        if not isinstance(doc, dict):
            raise ValueError(f"a JSON object expected, got {type(doc).__name__}")
        version = doc.get("version")
        if version not in READ_VERSIONS:
            raise ValueError(f"state version {version!r}, expected {STATE_VERSION} (written by another gatherwise "
                             "version)")
        return doc


def _key(bucket: int, mode: Mode) -> str:
    return f"{bucket}:{mode.label}"


def _parse_key(key: str) -> tuple[int, Mode]:
    bucket, label = key.split(":")
    if not 0 <= int(bucket) < NUM_BUCKETS:
        raise ValueError(f"bucket {bucket} out of range in key {key!r}")
    return int(bucket), Mode.parse(label)


def policy_to_json(policy: ModePolicy, extra: dict[str, Any] | None = None) -> str:
    """The document of every part's state (policy_from_json fills the same parts back)."""
    return state_text(policy, extra)[0]


def state_text(policy: ModePolicy, extra: dict[str, Any] | None = None) -> tuple[str, bool]:
    """(the document, whether its sample windows were left out to keep it within MAX_STATE_BYTES)."""
    state = _policy_state(policy, extra)
    text = state.model_dump_json()
    if len(text.encode()) <= MAX_STATE_BYTES:
        return text, False
    return state.model_copy(update={"estimates": {}, "kind_estimates": {}}).model_dump_json(), True


def _policy_state(policy: ModePolicy, extra: dict[str, Any] | None) -> PolicyState:
    choice, probes, traffic, log = policy.auto_choice, policy.probes, policy.traffic, policy.log
    probe, budget, backoff = probes.probe, probes.budget, probes.backoff
    return PolicyState(
        version=STATE_VERSION, params=policy.params, choice=[m.label for m in choice.choice],
        pins={b: m.label for b, m in policy.pinned.modes.items()}, last_switch=choice.last_switch,
        last_probe={_key(b, m): t for (b, m), t in probes.last_probe.items()},
        backoff={_key(b, m): f for (b, m), f in backoff.factors.items()},
        backoff_reference=backoff.reference,
        pairs={b: [(p.time, p.probed.label, p.reference.label, p.ratio, p.kind, p.log_se, p.calls) for p in v]
               for b, v in choice.pairs.items() if v},
        probe=None if probe is None else ProbeState(bucket=probe.bucket, mode=probe.mode.label,
                                                    started=probe.started, calls=probe.calls,
                                                    samples=probe.samples, references=probe.references,
                                                    extra=probe.extra),
        calls_total=budget.calls_total, probe_calls_used=budget.probe_calls_used,
        next_decision_id=log.next_id, decisions=list(log.decisions),
        estimates=traffic.estimates.to_json(), kind_estimates=traffic.kind_estimates.to_json(),
        mix={b: list(v.kinds) for b, v in traffic.mix.items() if v.kinds}, seconds_total=budget.seconds_total,
        probe_extra_seconds=budget.probe_extra_seconds, last_probe_end=probes.last_probe_end,
        extra=SessionExtra.model_validate(extra or {}),
    )


def policy_from_json(text: str) -> ModePolicy:
    """Rebuild a policy; any problem is a ValueError naming it (the caller then starts from the control block
    alone)."""
    try:
        state = PolicyState.model_validate_json(text)
    except ValidationError as exc:
        problems = joined_errors(exc, lambda e: f"{dotted_location(e['loc'], 'document')}: {error_text(e)}")
        raise ValueError(f"unreadable sidecar state: {problems}") from None
    try:
        policy = ModePolicy(state.params, ModeTable(tuple(Mode.parse(m) for m in state.choice)), auto=True)
        policy.pinned = Pins({b: Mode.parse(m) for b, m in state.pins.items()})
        choice, probes, traffic, log = policy.auto_choice, policy.probes, policy.traffic, policy.log
        choice.last_switch = dict(state.last_switch)
        choice.pairs = {b: deque((Pair(p[0], Mode.parse(p[1]), Mode.parse(p[2]), *p[3:]) for p in v),
                                 maxlen=PAIRS_KEPT) for b, v in state.pairs.items()}
        probes.last_probe = {_parse_key(k): t for k, t in state.last_probe.items()}
        probes.backoff.factors = {_parse_key(k): f for k, f in state.backoff.items()}
        probes.backoff.reference = dict(state.backoff_reference)
        probe = state.probe
        probes.probe = None if probe is None else Probe(probe.bucket, Mode.parse(probe.mode), probe.started,
                                                        probe.calls, probe.samples, probe.references, probe.extra)
        budget = probes.budget
        budget.calls_total, budget.probe_calls_used = state.calls_total, state.probe_calls_used
        budget.seconds_total, budget.probe_extra_seconds = state.seconds_total, state.probe_extra_seconds
        probes.last_probe_end = dict(state.last_probe_end)
        log.next_id = state.next_decision_id
        log.decisions.extend(state.decisions)
        traffic.estimates.load_json({k: [list(s) for s in v] for k, v in state.estimates.items()})
        traffic.kind_estimates.load_json({k: [list(s) for s in v] for k, v in state.kind_estimates.items()})
        traffic.mix = {b: KindMix(state.params.window, v) for b, v in state.mix.items()}
    except ValueError as exc:  # a key naming a bucket out of range or a mode this sidecar does not know
        raise ValueError(f"unreadable sidecar state: {exc}") from None
    policy.restored_extra = state.extra.model_dump()
    return policy


def save_state(path: str, text: str) -> None:
    write_private_file(path, text.encode())


def load_state(path: str) -> str | None:
    """The saved text, or None when there is none. OSError/ValueError for a file that is not ours to read
    (a symlink, a FIFO, too large) or not UTF-8; the caller then starts from the control block alone."""
    try:
        return read_small_file(path, MAX_STATE_BYTES).decode()
    except FileNotFoundError:
        return None
