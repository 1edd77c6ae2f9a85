"""Where request spans and metrics go: the `otlp_endpoint` and `otlp_headers` settings, else OpenTelemetry's standard
environment (OTEL_EXPORTER_OTLP_{TRACES,METRICS}_ENDPOINT, a full URL; OTEL_EXPORTER_OTLP_ENDPOINT, a base that the
signal's path, /v1/traces or /v1/metrics, is appended to unless there; OTEL_EXPORTER_OTLP_[SIGNAL_]HEADERS).
OTEL_SDK_DISABLED=true turns the export off."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Literal
from urllib.parse import unquote, urlsplit

from blazar.config import Settings

Signal = Literal["traces", "metrics"]
TRACES_PATH = "/v1/traces"
METRICS_PATH = "/v1/metrics"
_PATHS: dict[Signal, str] = {"traces": TRACES_PATH, "metrics": METRICS_PATH}


@dataclass(frozen=True)
class OtlpTarget:
    endpoint: str  # the full URL spans (or metrics) are POSTed to
    headers: dict[str, str] = field(default_factory=dict)
    source: str = "config"  # "config" or the environment variable that named it


def traces_url(base: str) -> str:
    """A bare scheme://host[:port] gets /v1/traces, as OTEL_EXPORTER_OTLP_ENDPOINT's base does; a path is kept."""
    return base.rstrip("/") + TRACES_PATH if urlsplit(base).path in ("", "/") else base


def metrics_url(base: str) -> str | None:
    """The metrics' URL beside `otlp_endpoint`'s spans: a bare host gets /v1/metrics, a path ending in /v1/traces
    its sibling /v1/metrics. None for any other path: that is a proxy's own route for spans, and where its metrics
    go cannot be guessed (OTEL_EXPORTER_OTLP_METRICS_ENDPOINT names it)."""
    path = urlsplit(base).path
    if path in ("", "/"):
        return base.rstrip("/") + METRICS_PATH
    if path.rstrip("/").endswith(TRACES_PATH):
        trimmed = base.rstrip("/")
        return trimmed[: -len(TRACES_PATH)] + METRICS_PATH
    return None


def _env_headers(text: str) -> dict[str, str]:
    """OTEL_EXPORTER_OTLP_HEADERS: comma-separated name=value, URL-encoded (the spec's form); bad pairs skipped."""
    out: dict[str, str] = {}
    for part in text.split(","):
        name, eq, value = part.partition("=")
        if eq and name.strip():
            out[unquote(name.strip()).lower()] = unquote(value.strip())
    return out


def otlp_target(settings: Settings, env: Mapping[str, str], signal: Signal = "traces") -> OtlpTarget | None:
    """The target of `signal`, or None: its export is off."""
    if env.get("OTEL_SDK_DISABLED", "").strip().lower() == "true":
        return None
    if signal == "metrics" and not settings.telemetry.otlp_metrics:
        return None
    upper, path = signal.upper(), _PATHS[signal]
    headers = _env_headers(env.get("OTEL_EXPORTER_OTLP_HEADERS", ""))
    headers.update(_env_headers(env.get(f"OTEL_EXPORTER_OTLP_{upper}_HEADERS", "")))
    headers.update({k.lower(): v for k, v in settings.telemetry.otlp_headers.items()})  # the config's win, name by name
    configured = settings.telemetry.otlp_endpoint
    if configured:
        url = traces_url(configured) if signal == "traces" else metrics_url(configured)
        if url is not None:
            return OtlpTarget(url, headers)
    full = env.get(f"OTEL_EXPORTER_OTLP_{upper}_ENDPOINT", "").strip()
    if full:
        return OtlpTarget(full, headers, source=f"OTEL_EXPORTER_OTLP_{upper}_ENDPOINT")
    base = env.get("OTEL_EXPORTER_OTLP_ENDPOINT", "").strip()
    if base and not configured:
        # The spec's base gets the signal's path, even one with a path of its own, unless it is there already.
        url = base if base.rstrip("/").endswith(path) else base.rstrip("/") + path
        return OtlpTarget(url, headers, source="OTEL_EXPORTER_OTLP_ENDPOINT")
    return None
