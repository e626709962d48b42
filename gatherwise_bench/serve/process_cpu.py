"""CPU time of what serves a cell, read from /proc around each client run: every process of the engine's session
(its server, engine core, each rank; vLLM and SGLang name their processes, e.g. `VLLM::Worker_TP0`,
`sglang::scheduler_TP1`), gatherwise's sidecar, the benchmark client, and the host as a whole. Reported as cores
kept busy (cores_busy says over which time). On a host whose cores the ranks share, a core a sidecar or a waiting
rank keeps busy is a core the step does not get: this is where such a cost shows, beside the throughput it costs."""

from __future__ import annotations

import os
import resource
from dataclasses import dataclass, field
from pathlib import Path

_TICKS = os.sysconf("SC_CLK_TCK")
_PROC = Path("/proc")
WHOLE_RUN = ("client", "host")  # counted over the client's whole run, not only its measured duration


def _stat(pid: str) -> tuple[int, float] | None:
    """(session id, CPU seconds so far) of a live process, or None when it has gone."""
    try:
        text = (_PROC / pid / "stat").read_text()
    except OSError:
        return None
    fields = text[text.rindex(")") + 2:].split()  # after the command name, which may hold spaces
    return int(fields[3]), (int(fields[11]) + int(fields[12])) / _TICKS


def _label(pid: str, session: int) -> str:
    """The process's own title where the engine sets one (`VLLM::EngineCore`), "server" for the session leader,
    else its command name."""
    try:
        first = (_PROC / pid / "cmdline").read_bytes().split(b"\0", 1)[0].decode(errors="replace").strip()
    except OSError:
        first = ""
    if "::" in first:
        return first.split()[0]
    if int(pid) == session:
        return "server"
    try:
        return (_PROC / pid / "comm").read_text().strip()
    except OSError:
        return "?"


def _host_busy_s() -> float:
    """CPU seconds the whole host has spent outside idle and iowait since boot."""
    values = [int(v) for v in (_PROC / "stat").read_text().split("\n", 1)[0].split()[1:]]
    return (sum(values) - values[3] - values[4]) / _TICKS


@dataclass
class CpuSnapshot:
    """CPU seconds so far per labelled process, at one instant."""

    seconds: dict[str, float] = field(default_factory=dict)

    @classmethod
    def take(cls, engine_session: int | None, sidecar_pid: int | None) -> CpuSnapshot:
        seconds: dict[str, float] = {}
        if engine_session is not None:
            for entry in _PROC.iterdir():
                if entry.name.isdigit():
                    stat = _stat(entry.name)
                    if stat is not None and stat[0] == engine_session:
                        label = _label(entry.name, engine_session)
                        seconds[label] = seconds.get(label, 0.0) + stat[1]
        if sidecar_pid is not None and (stat := _stat(str(sidecar_pid))) is not None:
            seconds["sidecar"] = stat[1]
        children = resource.getrusage(resource.RUSAGE_CHILDREN)  # the client, once it has been waited for
        seconds["client"] = children.ru_utime + children.ru_stime
        seconds["host"] = _host_busy_s()
        return cls(seconds)


def cores_busy(before: CpuSnapshot, after: CpuSnapshot, run_s: float, wall_s: float) -> dict[str, float]:
    """{label: cores kept busy} between two snapshots around a client run. The engine's processes and the sidecar
    over the client's measured duration `run_s` (they idle while the client starts and loads its tokenizer, so
    this is what serving its requests cost); the client and the host over the client's whole run `wall_s`, its own
    start included. A process that started or ended between the snapshots counts only the part it was seen for."""
    if run_s <= 0 or wall_s <= 0:
        return {}
    return {label: round((after.seconds[label] - before.seconds.get(label, 0.0))
                         / (wall_s if label in WHOLE_RUN else run_s), 3)
            for label in after.seconds}
