"""Trickle's own jobs API (``/v1/jobs``): submit, read and cancel a job."""
