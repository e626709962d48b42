"""Everything the sidecar's routes share, in one dataclass."""

from __future__ import annotations

import os
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Annotated

from fastapi import Depends, Request
from gatherwise.sidecar.controller import Controller
from gatherwise.sidecar.decision_events import DecisionEvents
from gatherwise.sidecar.hooks_off import HooksOffWatch
from gatherwise.sidecar.ingest import Ingest
from gatherwise.sidecar.metrics import SidecarMetrics
from gatherwise.sidecar.traces import CallTracer, build_tracer

from gatherwise.config import GatherwiseConfig


@dataclass
class SidecarState:
    config: GatherwiseConfig
    metrics: SidecarMetrics
    ingest: Ingest
    control: Controller  # the sidecar's loop and the control API; started and stopped with the app
    tracer: CallTracer | None = None
    started_at: float = field(default_factory=time.time)


def build_state(config: GatherwiseConfig, *, env: Mapping[str, str] | None = None,
                span_processor=None) -> SidecarState:
    """Registry, tracer, ingest and the loop that drives them for `config`. Nothing started."""
    env = os.environ if env is None else env
    hooks_off = HooksOffWatch(config.engine.shm_dir)
    metrics = SidecarMetrics(hooks_off=lambda: hooks_off.notices)
    tracer = build_tracer(config.traces, env=env, processor=span_processor)
    poll = config.sidecar.poll_interval_seconds
    ingest = Ingest(config.engine.shm_dir, metrics, tracer, poll_interval=poll, join_timeout=max(0.25, 10 * poll),
                    heartbeat_stale=config.sidecar.heartbeat_stale_seconds,
                    max_records_per_poll=config.sidecar.max_records_per_poll, hooks_off=hooks_off)
    control = Controller(config, ingest, DecisionEvents(metrics, tracer), env=env)
    return SidecarState(config, metrics, ingest, control, tracer)


def get_state(request: Request) -> SidecarState:
    """FastAPI dependency: the state create_app() was given."""
    return request.app.state.gatherwise


StateDep = Annotated[SidecarState, Depends(get_state)]
