"""Telemetry shared by both processes: metric definitions, the metrics registry and tracing."""
