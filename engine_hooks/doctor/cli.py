"""`gatherwise doctor`: pre-flight in the engine's environment: engines, fingerprints, shm directory, CPU settings.

Run it where the engine runs, before starting it: each installed engine (vLLM, SGLang) and its version, the
verdict of every fingerprint by point and of each runner (the hooks engage on a runner only when every point it
relies on matches one verified release), the runners and samplers gatherwise does not hook (where the hooks
step aside), the shared-memory directory with the size and free space of its filesystem, and the settings that
decide speed on a CPU host. Exit code 0 only when the hooks would engage, 1 otherwise (each reason printed).
Reads the engines' sources without importing them; needs only the engine-side install.
"""

from __future__ import annotations

import argparse

from gatherwise.engine_hooks.adapters.enable import ENABLE_ENV, enabled
from gatherwise.engine_hooks.doctor.cpu_section import cpu_section
from gatherwise.engine_hooks.doctor.engine_section import engine_sections, installed_engines
from gatherwise.engine_hooks.doctor.section import Section
from gatherwise.engine_hooks.doctor.shm_section import shm_section


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="gatherwise doctor", description=__doc__.split("\n\n")[0])
    parser.parse_args(argv)
    checks = installed_engines()
    plugin = Section("plugin")
    plugin.add(f"{ENABLE_ENV} is {'set' if enabled() else 'not set: the plugin does nothing until it is 1'}"
               " (in the engine's environment)")
    sections = [*engine_sections(checks), shm_section(), cpu_section({c.engine.name for c in checks}), plugin]
    print("\n\n".join(s.render() for s in sections))
    problems = [p for s in sections for p in s.problems]
    if problems:
        print(f"\nthe hooks would NOT engage ({len(problems)} reason{'s' if len(problems) > 1 else ''}):")
        print("\n".join(f"- {p}" for p in problems))
        return 1
    print("\nthe hooks would engage")
    return 0
