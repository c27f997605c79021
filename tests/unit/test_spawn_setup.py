"""``ops.stack.spawn`` gives subprocess a ``preexec_fn`` only when the child needs one: in a
parent with threads (the tests, the benchmarks) Python's docs warn that one can deadlock."""

from __future__ import annotations

from ops.stack import child_setup


def test_no_hook_and_no_nice_value_is_no_preexec_fn() -> None:
    assert child_setup(None, 0) is None


def test_a_hook_alone_runs_as_given() -> None:
    def hook() -> None:
        return None

    assert child_setup(hook, 0) is hook


def test_a_nice_value_needs_a_function() -> None:
    assert callable(child_setup(None, 5))
