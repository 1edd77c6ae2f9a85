"""Where request spans go: the `otlp_endpoint` and `otlp_headers` settings, else OpenTelemetry's standard
environment (OTEL_EXPORTER_OTLP_TRACES_ENDPOINT, a full URL; OTEL_EXPORTER_OTLP_ENDPOINT, a base that /v1/traces is
appended to unless there; OTEL_EXPORTER_OTLP_[TRACES_]HEADERS). OTEL_SDK_DISABLED=true turns the export off."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from urllib.parse import unquote, urlsplit

from blazar.config import Settings

TRACES_PATH = "/v1/traces"


@dataclass(frozen=True)
class OtlpTarget:
    endpoint: str  # the full URL spans are POSTed to
    headers: dict[str, str] = field(default_factory=dict)
    source: str = "config"  # "config" or the environment variable that named it


def traces_url(base: str) -> str:
    """A bare scheme://host[:port] gets /v1/traces, as OTEL_EXPORTER_OTLP_ENDPOINT's base does; a path is kept."""
    return base.rstrip("/") + TRACES_PATH if urlsplit(base).path in ("", "/") else base


def _env_headers(text: str) -> dict[str, str]:
    """OTEL_EXPORTER_OTLP_HEADERS: comma-separated name=value, URL-encoded (the spec's form); bad pairs skipped."""
    out: dict[str, str] = {}
    for part in text.split(","):
        name, eq, value = part.partition("=")
        if eq and name.strip():
            out[unquote(name.strip()).lower()] = unquote(value.strip())
    return out


def otlp_target(settings: Settings, env: Mapping[str, str]) -> OtlpTarget | None:
    """The target, or None: the export is off."""
    if env.get("OTEL_SDK_DISABLED", "").strip().lower() == "true":
        return None
    headers = _env_headers(env.get("OTEL_EXPORTER_OTLP_HEADERS", ""))
    headers.update(_env_headers(env.get("OTEL_EXPORTER_OTLP_TRACES_HEADERS", "")))
    headers.update({k.lower(): v for k, v in settings.telemetry.otlp_headers.items()})  # the config's win, name by name
    if settings.telemetry.otlp_endpoint:
        return OtlpTarget(traces_url(settings.telemetry.otlp_endpoint), headers)
    full = env.get("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "").strip()
    if full:
        return OtlpTarget(full, headers, source="OTEL_EXPORTER_OTLP_TRACES_ENDPOINT")
    base = env.get("OTEL_EXPORTER_OTLP_ENDPOINT", "").strip()
    if base:
        # The spec's base gets the signal's path, even one with a path of its own, unless it is there already.
        url = base if base.rstrip("/").endswith(TRACES_PATH) else base.rstrip("/") + TRACES_PATH
        return OtlpTarget(url, headers, source="OTEL_EXPORTER_OTLP_ENDPOINT")
    return None
