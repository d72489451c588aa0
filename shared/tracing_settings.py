"""Where a process sends its spans, read from the standard OpenTelemetry variable."""

from __future__ import annotations

from pydantic import Field
from pydantic_settings import SettingsConfigDict

from shared.service_settings import ServiceSettings


class TracingSettings(ServiceSettings):
    """``OTEL_EXPORTER_OTLP_ENDPOINT``: the collector spans go to (the exporter reads the other
    ``OTEL_*`` variables itself). Invariant: tracing is on exactly when ``endpoint`` is not
    blank."""

    model_config = SettingsConfigDict(env_prefix="OTEL_EXPORTER_OTLP_")

    endpoint: str = Field(default="", description="OTLP/HTTP collector; empty: tracing off")
