"""Whether a request gets in and how it is queued: API keys (``auth``), rate limits, per-key
policy, idempotency keys, the queue-depth bound and the submission of jobs to the broker."""
