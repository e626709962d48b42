"""gatherwise's torch-free core, imported by both sides: the engine hooks (in every TP rank) and the sidecar.

What both sides must agree on lives here and only here: the modes and the control word (`modes`), the
shared-memory formats (`shm_format`), the configuration schema (`config`) and mode-table files (`table_file`).
The modules of this folder import neither torch nor the sidecar's web/metrics/tracing stack, so both sides can
import them. The other floors install beneath this name (gatherwise.engine_hooks and gatherwise.tp_engine import
torch; gatherwise.sidecar the web stack and never torch); tests/core/test_import_boundaries.py holds each to its side.
"""

from importlib.metadata import PackageNotFoundError, version

try:
    HOOKS_VERSION = version("gatherwise")  # pyproject.toml's, as installed (or laid out by scripts/package_tree.py)
except PackageNotFoundError:  # a source tree on sys.path with no metadata beside it
    HOOKS_VERSION = "unknown"
