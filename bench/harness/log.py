"""Progress messages on stderr (the final table goes to stdout)."""

from __future__ import annotations

import sys
import time

_START = time.monotonic()


def progress(message: str) -> None:
    print(f"[bench {time.monotonic() - _START:7.1f}s] {message}", file=sys.stderr, flush=True)
