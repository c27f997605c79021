"""What operators and autoscalers read: health and readiness, ``/metrics`` and ``/scaling``."""
