"""The doctor's engine part: each installed engine, its version, every fingerprint's verdict by point, each
runner's engagement, and what would step aside."""

from __future__ import annotations

import importlib.util
import platform

from gatherwise.engine_hooks.doctor.section import Section
from gatherwise.engine_hooks.fingerprints.check import Engagement
from gatherwise.engine_hooks.fingerprints.engines import ENGINES, InstallCheck, check_install
from gatherwise.engine_hooks.fingerprints.vllm_points import STANDALONE_CPU

X86 = ("x86_64", "amd64", "i386", "i686")


def installed_engines() -> list[InstallCheck]:
    """Each engine installed in this environment, checked against its verified releases."""
    return [c for c in (check_install(engine) for engine in ENGINES.values()) if c is not None]


def engine_sections(checks: list[InstallCheck]) -> list[Section]:
    """One section per installed engine; one refusing section when none is installed."""
    if not checks:
        none = Section("engines")
        none.refuse(f"none of {', '.join(e.label for e in ENGINES.values())} is installed in this environment")
        return [none]
    return [engine_section(check) for check in checks]


def engine_section(check: InstallCheck) -> Section:
    section = Section(f"{check.engine.label} {check.version}")
    for e in check.engagements:
        section.add(f"runner {e.runner.runner}: {_runner_text(e)}")
        if e.runner.hooked and not e.engage:
            section.refuse(e.reason)
        elif not e.runner.hooked and _selected_here(e) is not False:
            section.refuse(e.reason + _selection_text(e))
    absent = sorted({r.runner for r in check.engine.runners} - {e.runner.runner for e in check.engagements})
    if absent:
        section.add(f"not in this install: {', '.join(absent)}")
    section.add("points:")
    verdicts = {v.point: v for e in check.engagements for v in e.verdicts}  # a shared point once
    section.lines.extend(f"  {v.verdict:8} {v.text()}" for v in verdicts.values())
    return section


def _runner_text(e: Engagement) -> str:
    if e.engage:
        return f"{e.runner.description}: hooks engage (every point matches {e.release})"
    if not e.runner.hooked:
        return f"{e.runner.description}: not hooked, the hooks step aside there{_selection_text(e)}"
    return f"{e.runner.description}: hooks refuse"


def _selected_here(e: Engagement) -> bool | None:
    """Whether the engine would run this unhooked runner on this host (None: cannot tell)."""
    if e.runner == STANDALONE_CPU:  # vLLM's CpuPlatform.uses_standalone_cpu_model_runner
        return platform.machine().lower() not in X86 and importlib.util.find_spec("triton") is None
    return None


def _selection_text(e: Engagement) -> str:
    selected = _selected_here(e)
    if e.runner == STANDALONE_CPU:
        where = "on CPUs other than x86 without Triton"
        return f" (vLLM runs it {where}: {'this host' if selected else 'not this host'})"
    return " (whether the engine runs it here cannot be told before it starts)" if selected is None else ""
