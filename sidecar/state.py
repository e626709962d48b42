"""The sidecar's composition root: every part built once, each given what it reads (the routes reach it through
gatherwise.sidecar.api.deps)."""

from __future__ import annotations

import os
import time
from collections.abc import Mapping
from dataclasses import dataclass, field

from opentelemetry.sdk.trace.export import SpanProcessor

from gatherwise.config import GatherwiseConfig
from gatherwise.sidecar.control.control_api import ControlApi, api_token
from gatherwise.sidecar.control.decision_events import DecisionEvents
from gatherwise.sidecar.control.decision_publisher import DecisionPublisher
from gatherwise.sidecar.control.loop import Loop
from gatherwise.sidecar.control.role import ROLES
from gatherwise.sidecar.control.schedule import SidecarSchedule
from gatherwise.sidecar.control.session_lifecycle import SessionLifecycle
from gatherwise.sidecar.control.session_store import SessionStore
from gatherwise.sidecar.ingest.hooks_off import HooksOffWatch
from gatherwise.sidecar.ingest.live_history import LiveHistory
from gatherwise.sidecar.ingest.poll import Ingest
from gatherwise.sidecar.metrics.control_gauges import ControlGaugesCollector
from gatherwise.sidecar.metrics.engine_route import EngineRouteCollector
from gatherwise.sidecar.metrics.exposition import SidecarMetrics
from gatherwise.sidecar.metrics.header_counters import HeaderCountersCollector
from gatherwise.sidecar.metrics.hooks_off_gauge import HooksOffCollector
from gatherwise.sidecar.metrics.record_histograms import RecordHistograms
from gatherwise.sidecar.metrics.role_gauge import RoleCollector
from gatherwise.sidecar.traces.tracer import CallTracer, build_tracer


@dataclass
class SidecarState:
    config: GatherwiseConfig
    metrics: SidecarMetrics
    ingest: Ingest
    schedule: SidecarSchedule  # the sidecar's loop; started and stopped with the app
    control: ControlApi
    live: LiveHistory  # the live page's path over time (points taken by the schedule)
    tracer: CallTracer | None = None
    started_at: float = field(default_factory=time.time)

    @property
    def loop(self) -> Loop:
        """The thread every read and write of the sidecar's moving state runs on (gatherwise.sidecar.control.loop)."""
        return self.schedule.loop


def build_state(config: GatherwiseConfig, *, env: Mapping[str, str] | None = None,
                span_processor: SpanProcessor | None = None) -> SidecarState:
    """Every part of the sidecar for `config`, wired. Nothing started. `span_processor`: where spans go instead of
    the configured exporter (tests)."""
    env = os.environ if env is None else env
    hooks_off = HooksOffWatch(config.engine.shm_dir)
    tracer = build_tracer(config.traces, env=env, processor=span_processor)
    histograms = RecordHistograms()
    poll = config.sidecar.poll_interval_seconds
    ingest = Ingest(config.engine.shm_dir, histograms, hooks_off, tracer, join_timeout=max(0.25, 10 * poll),
                    heartbeat_stale=config.sidecar.heartbeat_stale_seconds,
                    max_records_per_poll=config.sidecar.max_records_per_poll)
    events = DecisionEvents(tracer)
    store = SessionStore(config.engine.initial_mode, auto=config.policy.mode == "auto")
    publisher = DecisionPublisher(events, store)
    sessions = SessionLifecycle(config, events, store, publisher)
    live = LiveHistory(ingest)
    schedule = SidecarSchedule(ingest, sessions, publisher, store, live, poll_interval=poll)
    control = ControlApi(sessions, publisher, store, schedule.loop, api_token=api_token(config.sidecar.api_token, env),
                         shm_dir=str(config.engine.shm_dir), attached=lambda: ingest.engine)
    metrics = SidecarMetrics(histograms, [HeaderCountersCollector(ingest.counters),
                                          HooksOffCollector(lambda: hooks_off.notices), events.mode_switches,
                                          ControlGaugesCollector(control.control_view),
                                          RoleCollector(control.attached_role, ROLES),
                                          EngineRouteCollector(lambda: None if (eng := ingest.engine) is None
                                                               else (eng.label, live.rank_infos(eng)))])
    return SidecarState(config, metrics, ingest, schedule, control, live, tracer)
