"""OpenTelemetry traces built after the fact from ring records: one trace per sampled logits call.

A trace is a root span `logits.call` (earliest rank start to latest rank end) with one child span per rank and
operation, timed exactly from the records: the mode's collectives (`all_gather`; `gather` + `broadcast`;
`shard_exchange` + `shard_resolve`: gatherwise.shm_format.ring.MODE_OPS), `sample`, `logits_path`. Which calls
are traced and every id of their traces follow from (engine id, call index) (call_sampling, call_ids), so on a
multi-node group each node's sidecar traces the same calls into the same traces: the sidecar that reads rank 0
emits the root span, every other node's sidecar only its ranks' spans, under that root.
Records carry CLOCK_MONOTONIC ns (perf_counter_ns on Linux); spans need epoch ns, so one offset measured at
sidecar start converts them. Spans go through a BatchSpanProcessor: a slow or failing exporter never blocks
ingestion (the queue drops instead). The provider is passed in, never installed globally.
"""

from __future__ import annotations

import os
import time
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from opentelemetry import trace
from opentelemetry.sdk.resources import SERVICE_NAME, Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor, SpanExporter, SpanProcessor
from opentelemetry.trace import NonRecordingSpan, SpanContext, TraceFlags
from opentelemetry.util.types import AttributeValue

from gatherwise.modes import Mode
from gatherwise.shm_format.ring import MODE_OPS
from gatherwise.sidecar.traces.call_ids import CallIdGenerator, call_root_span_id, call_span_id, call_trace_id
from gatherwise.sidecar.traces.call_sampling import CallSampling

if TYPE_CHECKING:  # the GPU check imports this module without pydantic, which the config needs
    from gatherwise.config import TracesSection
    from gatherwise.shm_format.ring import CallRecord

ROOT_SPAN = "logits.call"
MODE_SWITCH_SPAN = "mode.switch"
_OTLP_ENV = ("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "OTEL_EXPORTER_OTLP_ENDPOINT")


def monotonic_to_epoch_offset_ns() -> int:
    """epoch ns - monotonic ns, measured once (both clocks read back to back)."""
    return time.time_ns() - time.monotonic_ns()


def new_provider(service_name: str, processor: SpanProcessor) -> TracerProvider:
    """A tracer provider of our own (never installed globally) sending every span to `processor`; its ids come
    from a CallIdGenerator (CallTracer hands it the ids of a call's spans)."""
    provider = TracerProvider(resource=Resource.create({SERVICE_NAME: service_name}),
                              id_generator=CallIdGenerator(), shutdown_on_exit=False)
    provider.add_span_processor(processor)
    return provider


class CallTracer:
    """Turns the records of one call (the ranks read here) into a trace, when the call is sampled."""

    def __init__(self, provider: TracerProvider, *, sample_ratio: float = 0.01, every_nth: int = 0,
                 offset_ns: int | None = None) -> None:
        if not isinstance(provider.id_generator, CallIdGenerator):
            raise TypeError("a CallTracer needs a provider whose id generator is a CallIdGenerator (new_provider)")
        self.provider = provider
        self.ids: CallIdGenerator = provider.id_generator
        self.tracer = provider.get_tracer("gatherwise.sidecar")
        self.sample_ratio, self.every_nth = sample_ratio, every_nth
        self._sampled = CallSampling(sample_ratio, every_nth)
        self.offset_ns = monotonic_to_epoch_offset_ns() if offset_ns is None else offset_ns
        self.traces_started = 0

    def should_sample(self, call_index: int) -> bool:
        """The same answer for a call index in every sidecar (call_sampling)."""
        return self._sampled(call_index)

    def trace_call(self, engine: str, tp_size: int, call_index: int, records: Mapping[int, CallRecord],
                   complete: bool = True, *, root: bool = True) -> str:
        """Emit the spans of one call; returns its trace id (32 hex digits) for exemplars. `engine`: the engine
        id as 16 hex digits. `root`: whether this sidecar emits the root span (it reads rank 0); without it the
        ranks' spans name the root that rank 0's sidecar emits as their parent."""
        engine_id = int(engine, 16)
        trace_id, root_id = call_trace_id(engine_id, call_index), call_root_span_id(engine_id, call_index)
        off = self.offset_ns
        first = next(iter(records.values()))
        mode = Mode(first.mode)
        root_span = None
        if root:
            self.ids.next_ids(root_id, trace_id)
            root_span = self.tracer.start_span(
                ROOT_SPAN, start_time=min(r.start_ns for r in records.values()) + off,
                attributes={"gatherwise.engine": engine, "gatherwise.call_index": call_index, "tp.size": tp_size,
                            "gatherwise.mode": mode.label, "gatherwise.rows": first.rows,
                            "gatherwise.epoch": first.epoch, "gatherwise.complete": complete,
                            "gatherwise.ranks": len(records),
                            "gatherwise.topp_fallback_rows": max(r.fallback_rows for r in records.values())})
            ctx = trace.set_span_in_context(root_span)
        else:  # the root lives in rank 0's sidecar: name it as a remote parent
            parent = SpanContext(trace_id, root_id, is_remote=True, trace_flags=TraceFlags(TraceFlags.SAMPLED))
            ctx = trace.set_span_in_context(NonRecordingSpan(parent))
        for rank in sorted(records):
            rec = records[rank]
            attrs: dict[str, AttributeValue] = {
                "tp.rank": rank, "tp.size": tp_size, "gatherwise.mode": mode.label, "gatherwise.rows": rec.rows,
                "gatherwise.bytes": rec.nbytes, "gatherwise.epoch": rec.epoch}
            for name, start, duration in _operations(rec, mode):
                self.ids.next_ids(call_span_id(engine_id, call_index, rank, name))
                span = self.tracer.start_span(name, context=ctx, start_time=start + off, attributes=attrs)
                span.end(end_time=start + duration + off)
        if root_span is not None:
            root_span.end(end_time=max(r.end_ns for r in records.values()) + off)
        self.traces_started += 1
        return format(trace_id, "032x")

    def mode_switch_event(self, engine: str, *, reason: str, from_table: Mapping[str, str],
                          to_table: Mapping[str, str], call_index: int | None = None,
                          evidence: Mapping[str, Any] | None = None, at_monotonic_ns: int | None = None) -> str:
        """Record a mode switch as a span `mode.switch` carrying a `mode.switch` event; returns the trace id.

        Tables are {"1": "gather", ...} (ModeTable.as_labels()); only changed buckets go into the attributes.
        """
        when = (time.monotonic_ns() if at_monotonic_ns is None else at_monotonic_ns) + self.offset_ns
        changed = {b: f"{from_table.get(b)}->{m}" for b, m in to_table.items() if from_table.get(b) != m}
        attrs: dict[str, Any] = {"gatherwise.engine": engine, "gatherwise.switch.reason": reason,
                                 "gatherwise.switch.changed": [f"{b}:{c}" for b, c in changed.items()]}
        if call_index is not None:
            attrs["gatherwise.call_index"] = call_index
        for key, value in (evidence or {}).items():
            attrs[f"gatherwise.evidence.{key}"] = value if isinstance(value, (str, bool, int, float)) else str(value)
        span = self.tracer.start_span(MODE_SWITCH_SPAN, start_time=when, attributes=attrs)
        span.add_event(MODE_SWITCH_SPAN, attributes=attrs, timestamp=when)
        span.end(end_time=when)
        return format(span.get_span_context().trace_id, "032x")

    def shutdown(self) -> None:
        self.provider.shutdown()


def _operations(rec: CallRecord, mode: Mode) -> list[tuple[str, int, int]]:
    """(span name, start ns, duration ns) of each operation one rank ran in this call: the mode's first
    collective (MODE_OPS), sampling where this rank sampled, the second operation the record names (broadcast,
    shard_resolve), and the whole path."""
    ops = [(MODE_OPS[mode][0], rec.collective_start_ns, rec.collective_ns)]
    if rec.sample_ns or rec.rank == 0:
        ops.append(("sample", rec.sample_start_ns, rec.sample_ns))
    if rec.second_op is not None:
        ops.append((rec.second_op, rec.second_start_ns, rec.second_ns))
    ops.append(("logits_path", rec.start_ns, rec.end_ns - rec.start_ns))
    return ops


def otlp_endpoint(configured: str | None) -> str | None:
    """The full traces URL for a configured endpoint (a base URL gets /v1/traces appended, like OTEL_*)."""
    if configured:
        return configured if configured.rstrip("/").endswith("/v1/traces") else configured.rstrip("/") + "/v1/traces"
    return None


def build_tracer(traces_cfg: TracesSection, *, env: Mapping[str, str] | None = None,
                 processor: SpanProcessor | None = None) -> CallTracer | None:
    """A CallTracer per config (section `traces`): OTLP/HTTP to traces.otlp_endpoint or the OTEL_* variables,
    or into `processor` (tests). None when traces are disabled or nowhere to send them."""
    env = os.environ if env is None else env
    if not traces_cfg.enabled:
        return None
    if processor is None:
        endpoint = otlp_endpoint(traces_cfg.otlp_endpoint)
        if endpoint is None and not any(env.get(k) for k in _OTLP_ENV):
            return None
        processor = BatchSpanProcessor(_otlp_exporter(endpoint, env))
    provider = new_provider(env.get("OTEL_SERVICE_NAME") or traces_cfg.service_name, processor)
    return CallTracer(provider, sample_ratio=traces_cfg.sample_ratio, every_nth=traces_cfg.every_nth)


def _otlp_exporter(endpoint: str | None, env: Mapping[str, str]) -> SpanExporter:
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter

    # Explicit endpoint wins; otherwise the exporter reads OTEL_EXPORTER_OTLP_(TRACES_)ENDPOINT itself.
    timeout = None if env.get("OTEL_EXPORTER_OTLP_TIMEOUT") or env.get("OTEL_EXPORTER_OTLP_TRACES_TIMEOUT") else 5.0
    return OTLPSpanExporter(endpoint=endpoint, timeout=timeout)
