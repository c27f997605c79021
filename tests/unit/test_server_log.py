"""The log reader the system tier uses finds real faults and ignores what clients sent."""

from tests.server_log import server_faults

ACCESS = (
    '127.0.0.1 - - [04/Dec/2026:17:36:42 +0000] "GET /v1/jobs/job_1?token=+Traceback HTTP/1.1"'
    ' 401 177 "-" "schemathesis/4.32.5"'
)
FAULT = """ERROR:web.common.errors:unhandled error
Traceback (most recent call last):
  File "web/app.py", line 1, in view
ValueError: boom"""


def test_a_word_in_a_request_line_is_not_a_fault() -> None:
    assert server_faults(ACCESS + "\n" + ACCESS.replace("Traceback", "unhandled%20error")) == []


def test_a_logged_exception_is_found() -> None:
    found = server_faults(ACCESS + "\n" + FAULT)
    assert found == [
        "ERROR:web.common.errors:unhandled error",
        "Traceback (most recent call last):",
    ]
