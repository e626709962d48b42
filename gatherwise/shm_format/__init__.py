"""Shared-memory formats shared by the engine hooks (writers) and the sidecar (readers).

Stdlib only, and importing this package imports nothing else: the sidecar must never pull in torch.
`ring.py`: the per-rank telemetry ring; `control.py`: the control block. Both are documented in docs/shm-format.md.
"""
