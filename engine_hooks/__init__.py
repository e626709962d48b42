"""gatherwise engine hooks: the logits->tokens path that runs inside every TP rank.

Importing this package must stay cheap and torch-free: the sidecar imports the stdlib-only
format modules (`engine_hooks.modes`, `engine_hooks.shm_format`) from it.
"""

HOOKS_VERSION = "0.1.0"
