"""Whether the hooks may engage on the installed engine, decided by what its code is (its fingerprints,
gatherwise.engine_hooks.fingerprints), never by its version string. The plugin asks once per process before
anything is patched: it engages when at least one runner gatherwise hooks matches a verified release at every
point it relies on. Each worker asks again once its runner is known (InstallCheck.runner_refusal): the runner it
actually runs must be one of those.
"""

from __future__ import annotations

from gatherwise.engine_hooks.fingerprints.engines import ENGINES, InstallCheck, check_install


def check_engine(name: str) -> InstallCheck | None:
    """The installed engine `name` ("vllm", "sglang") against its verified releases; None when it is not
    installed. Reads its sources and metadata only: no engine module is imported."""
    return check_install(ENGINES[name])


def install_refusal(check: InstallCheck | None, engine: str) -> str | None:
    """Why the plugin must leave `engine` untouched (None: at least one hooked runner engages)."""
    if check is None:
        return f"{engine} is not installed"
    hooked = check.hooked()
    if any(e.engage for e in hooked):
        return None
    if not hooked:
        return f"{engine} {check.version} has none of the runners gatherwise hooks"
    return f"{engine} {check.version} matches no verified release: " + "; ".join(e.reason for e in hooked)
