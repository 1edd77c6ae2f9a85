"""OpenTelemetry: request spans folded from the log's request events and exported over OTLP/HTTP (off unless
`otlp_endpoint` or OTEL_EXPORTER_OTLP_[TRACES_]ENDPOINT names a collector)."""
