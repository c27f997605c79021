"""The batch tier below the request tier on the CPU: a Procfile process's nice value.

On a busy host the web tier's slow answers are time spent runnable but waiting for a core
(its run delay), while the batch consumer reads a large input into jobs or settles one into
files (docs/performance.md). So whatever starts the Procfile's processes (``trickle up``, the
tests' and benchmarks' ``ops.stack``) starts the batch consumer at ``[supervisor]
batch_niceness``, as a serving system keeps its background tier behind its request tier.

``trickle.process_priority.lower_priority`` sets it, with the session's autogroup where the
process leads its session (every ``trickle up`` child does).
"""

from __future__ import annotations

from trickle.config.sections import SupervisorSettings


def niceness(kind: str, settings: SupervisorSettings) -> int:
    """The nice value a Procfile process type runs at."""
    return settings.batch_niceness if kind == "batch" else 0
