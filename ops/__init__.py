"""Operator tooling: the `trickle` command (demo model, embedded stack)."""
