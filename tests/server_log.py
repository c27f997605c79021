"""Reads a server log for faults without being fooled by what clients sent.

A fuzzer's query string is written verbatim into the access log, so a plain substring test
for "Traceback" fails when the fuzzer happens to send that word. Access-log lines are skipped;
every other line (logging records and the traceback text after them) is searched.
"""

import re

ACCESS_LINE = re.compile(r'^\S+ - \S+ \[[^\]]+\] "')
FAULT_MARKS = ("Traceback", "unhandled error")


def server_faults(log_text: str) -> list[str]:
    """Returns the log's lines, access lines excepted, that show a traceback or unhandled error."""
    return [
        line
        for line in log_text.splitlines()
        if not ACCESS_LINE.match(line) and any(mark in line for mark in FAULT_MARKS)
    ]
