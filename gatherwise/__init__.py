"""gatherwise's torch-free core, imported by both sides: the engine hooks (in every TP rank) and the sidecar.

What both sides must agree on lives here and only here: the modes and the control word (`modes`), the
shared-memory formats (`shm_format`), the configuration schema (`config`) and mode-table files (`table_file`).
Nothing in this package imports torch or the sidecar's web/metrics/tracing stack (tests/test_import_boundaries.py).
"""

HOOKS_VERSION = "0.1.0"
