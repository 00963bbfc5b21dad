"""A request's time limits and the one-line reasons they give."""

from __future__ import annotations

import time
from collections.abc import Iterator

import pytest

from engines.errors import RequestFailed
from engines.http_errors import RequestDeadline, error_message


def test_which_limit_a_read_timeout_names() -> None:
    url = "http://h/v1/completions"
    first = RequestDeadline(total_s=60, first_byte_s=2)
    assert first.read_s == 2
    assert str(first.read_timed_out(url)) == f"no response from {url} within 2 s (MOEBENCH_FIRST_BYTE_TIMEOUT_S)"
    first.answered = True
    assert str(first.read_timed_out(url)) == f"{url} sent nothing for 2 s (MOEBENCH_FIRST_BYTE_TIMEOUT_S)"
    total = RequestDeadline(total_s=1.5, first_byte_s=300, total_source="option timeout_s")
    assert total.read_s == 1.5  # a read never waits past the whole deadline
    assert str(total.read_timed_out(url)) == "request exceeded its 1.5 s deadline (option timeout_s)"


def test_checked_chunks_stop_at_the_deadline() -> None:
    deadline = RequestDeadline(total_s=0.2, first_byte_s=300)

    def trickle() -> Iterator[bytes]:
        while True:
            yield b": keep-alive\n\n"
            time.sleep(0.05)

    got = 0
    with pytest.raises(RequestFailed, match=r"^request exceeded its 0\.2 s deadline \(MOEBENCH_REQUEST_TIMEOUT_S\)$"):
        for _ in deadline.checked(trickle()):
            got += 1
    assert 2 <= got <= 6


def test_error_message_reads_openai_bodies() -> None:
    assert error_message(b'{"error": {"message": "CUDA out\\nof memory"}}') == "CUDA out of memory"
    assert error_message(b"") == "(empty body)"
