"""What defines a run: :class:`RunConfig`, its bounds and help, stated once.

The CLI's flags and the dashboard's run forms read their limits and help texts from
these fields (``RunConfig.model_fields[name]``), so a bound lives in one place.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from bench.workloads import WorkloadSpec
from engines.base import EngineOptions, SamplingParams, parse_options
from engines.errors import ConfigError

Mode = Literal["latency", "concurrency", "profile"]
MODES: tuple[str, ...] = ("latency", "concurrency", "profile")

MAX_WORKERS = 16
DURATION_MAX_REQUESTS = 1_000_000  # the request cap of a duration-bound run that names none
TRACE_IN_FLIGHT = 1024  # a trace run's in-flight cap when it names none: its requests are due on the trace's clock


def parse_ray_address(address: str) -> str:
    """``auto``, ``host:port`` or ``ray://host:port``; anything else is refused (ValueError, one line)."""
    a = address.strip()
    if a == "auto":
        return a
    rest = a.removeprefix("ray://")
    host, sep, port = rest.rpartition(":")
    if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536 or "/" in rest or "@" in rest:
        raise ValueError(f"'{address}' is not auto, host:port or ray://host:port")
    return a


class RunConfig(BaseModel):
    """Everything that defines a run; stored with it as JSON."""

    model_config = ConfigDict(extra="forbid")

    engine: dict[str, Any] = Field(default_factory=lambda: {"kind": "native"})
    mode: Mode = "concurrency"
    workload: WorkloadSpec = Field(default_factory=WorkloadSpec)
    requests: int = Field(8, ge=1, le=1_000_000, description="Measured requests")
    concurrency: int = Field(1, ge=1, le=4096, description="Most requests in flight at once (all workers together)")
    warmup: int = Field(
        1,
        ge=0,
        le=1000,
        description="Unrecorded requests sent before the clock starts, up to the concurrency at once (at least the "
        "concurrency warms a GPU server's batch sizes)",
    )
    request_rate: float | None = Field(
        None,
        gt=0.0,
        allow_inf_nan=False,
        le=1_000_000.0,
        description="Open loop: arrivals per second, capped at the concurrency (empty or 0: closed loop)",
    )
    burstiness: float = Field(
        1.0,
        gt=0.0,
        le=1000.0,
        allow_inf_nan=False,
        description="Gamma shape of the arrival gaps: 1 = Poisson, below 1 burstier",
    )
    workers: int = Field(
        1,
        ge=1,
        le=MAX_WORKERS,
        description="Sender processes for HTTP engines; the schedule and the concurrency cap stay global",
    )
    duration_s: float | None = Field(
        None,
        gt=0.0,
        allow_inf_nan=False,
        le=7 * 86400.0,
        description="Duration-bound run: send for this many seconds, then let the requests in flight finish "
        "(requests becomes a cap; empty: the request count bounds the run)",
    )
    ramp_up_s: float = Field(
        0.0,
        ge=0.0,
        allow_inf_nan=False,
        le=86400.0,
        description="Linear ramp-up: the concurrency (closed loop) or the arrival rate (open loop) climbs to its "
        "target over this many seconds",
    )
    until_ci: str | None = Field(
        None,
        max_length=100,
        description="Statistical stopping, METRIC:STAT:PCT (ttft_ms:p50:5%): send until the 95 % confidence "
        "half-width of that figure (batch means) is at most PCT % of it, or requests/duration run out",
    )
    slos: list[str] = Field(
        default_factory=list,
        description="Service-level objectives, METRIC:STAT<=LIMIT_MS (ttft_ms:p99<=2000) or a preset "
        "(mlperf-server, interactive): the run reports goodput and whether it met them",
    )
    temperature: float = Field(0.0, ge=0.0, le=5.0, allow_inf_nan=False, description="0 = greedy")
    top_p: float = Field(1.0, gt=0.0, le=1.0, allow_inf_nan=False)
    ignore_eos: bool = Field(True, description="Every output is exactly output_len tokens long")
    name: str = Field("", max_length=200, description="A label for the run")
    sample_interval_s: float = Field(1.0, gt=0.0, le=60.0, description="Seconds between live samples")
    # Each scrape costs the server CPU (about 15 ms on the vLLM CPU server), which off avoids.
    server_metrics: bool = Field(True, description="Scrape the engine's own /metrics once a second")
    profile_with_stack: bool = Field(
        True,
        description="Profile runs on the native engine: Python stacks per operator (slower analysis); a vLLM "
        "server records them if started with profiler_with_stack",
    )
    device_telemetry: bool = Field(
        True,
        description="Read the accelerator's own telemetry once a second (NVML on cuda, npu-smi on npu, cnmon on "
        "mlu): utilisation, memory, power, clock, temperature per device; a missing tool is noted, never fatal",
    )
    ray_address: str | None = Field(
        None,
        max_length=300,
        description="Send from Ray actors spread over this cluster's nodes (auto, host:port or ray://host:port), "
        "one per worker; the schedule and the concurrency cap stay global. Empty: processes on this machine",
    )
    telemetry_urls: list[str] = Field(
        default_factory=list,
        max_length=16,
        description="Prometheus exporters to scrape once a second for device telemetry (NVIDIA DCGM exporter, "
        "Ascend npu-exporter, Cambricon mlu-exporter), e.g. http://gpu-host:9400/metrics",
    )

    @field_validator("engine")
    @classmethod
    def _engine_options(cls, v: dict[str, Any]) -> dict[str, Any]:
        return parse_options(v).model_dump()

    @field_validator("telemetry_urls")
    @classmethod
    def _telemetry_urls(cls, v: list[str]) -> list[str]:
        from engines.http_errors import redacted

        out = []
        for url in v:
            url = url.strip()
            authority = url.split("://", 1)[1].split("/", 1)[0] if "://" in url else ""
            if not url.startswith(("http://", "https://")) or not authority:
                raise ValueError(f"a telemetry URL must be http(s)://host[:port]/path, got '{redacted(url)}'")
            if "@" in authority:
                raise ValueError(f"a telemetry URL carries credentials ({redacted(url)}); exporters take none")
            out.append(url)
        return out

    @field_validator("ray_address")
    @classmethod
    def _ray_address(cls, v: str | None) -> str | None:
        return parse_ray_address(v) if v and v.strip() else None

    @field_validator("slos")
    @classmethod
    def _slos(cls, v: list[str]) -> list[str]:
        from bench.metrics.slo import SloError, parse_slos

        try:
            return [s.text for s in parse_slos(v)]
        except SloError as exc:
            raise ValueError(str(exc)) from exc

    @model_validator(mode="after")
    def _duration_bound_cap(self) -> RunConfig:
        # A duration-bound run without an explicit count: enough tickets for the duration
        # (an open loop's arrivals are drawn up front; a closed loop's are only a counter).
        if self.duration_s is not None and "requests" not in self.model_fields_set:
            if self.request_rate is not None:
                self.requests = min(DURATION_MAX_REQUESTS, int(self.request_rate * self.duration_s * 1.5) + 16)
            else:
                self.requests = DURATION_MAX_REQUESTS
        return self

    @model_validator(mode="after")
    def _stop_rule(self) -> RunConfig:
        if self.until_ci is None:
            return self
        from bench.metrics.confidence import parse_stop_rule

        self.until_ci = parse_stop_rule(self.until_ci).text  # ValueError: one line
        if self.ray_address:
            raise ValueError("until_ci needs the senders on this machine (not Ray): drop ray_address or until_ci")
        return self

    @model_validator(mode="after")
    def _trace_sets_its_own_arrivals(self) -> RunConfig:
        if self.workload.source != "trace":
            return self
        if self.mode == "latency":
            raise ValueError("a trace is replayed open loop on its own clock: use mode concurrency (or profile)")
        if self.request_rate is not None or self.ramp_up_s:
            raise ValueError("a trace sets its own arrival times: drop request_rate and ramp_up_s (see time_scale)")
        if "concurrency" not in self.model_fields_set:
            self.concurrency = TRACE_IN_FLIGHT  # no cap unless one is given (the sender's slots, bounded)
        return self

    @model_validator(mode="after")
    def _latency_is_sequential(self) -> RunConfig:
        if self.mode == "latency":
            if self.request_rate is not None:
                raise ValueError(
                    "request_rate applies to concurrency and profile runs; a latency run sends one request at a time"
                )
            self.concurrency = 1
        if self.workers > self.concurrency:
            raise ValueError(
                f"{self.workers} workers need a concurrency of at least {self.workers} (each keeps a slot busy)"
            )
        return self

    @classmethod
    def build(cls, **data: Any) -> RunConfig:
        """Validate, turning pydantic errors into one-line :class:`ConfigError`."""
        if data.get("request_rate") == 0:
            data["request_rate"] = None  # 0 = closed loop, as the forms say
        try:
            return cls.model_validate(data)
        except ValidationError as exc:
            parts = []
            for err in exc.errors():
                loc = ".".join(str(x) for x in err["loc"]) or "config"
                parts.append(f"{loc}: {str(err['msg']).removeprefix('Value error, ')}")
            raise ConfigError("; ".join(parts)) from exc

    @property
    def engine_options(self) -> EngineOptions:
        return parse_options(self.engine)

    def sampling(self) -> SamplingParams:
        return SamplingParams(
            max_tokens=self.workload.output_len,
            temperature=self.temperature,
            top_p=self.top_p,
            ignore_eos=self.ignore_eos,
            seed=self.workload.seed if self.temperature > 0 else None,
        )


def field_bounds(name: str, model: type[BaseModel] = RunConfig) -> dict[str, Any]:
    """``min_value``, ``max_value`` and ``help`` of a numeric field, for a form widget.

    ``gt`` bounds (exclusive) are given as the bound itself: forms step above it.
    """
    info = model.model_fields[name]
    out: dict[str, Any] = {}
    for meta in info.metadata:
        for attr, key in (("ge", "min_value"), ("gt", "min_value"), ("le", "max_value"), ("lt", "max_value")):
            value = getattr(meta, attr, None)
            if value is not None:
                out[key] = value
    if info.description:
        out["help"] = info.description
    return out
