"""The one helper that puts text or an exception on one line."""

from __future__ import annotations

from engines.errors import RequestFailed, one_line


def test_one_line_collapses_whitespace_and_cuts_at_the_limit() -> None:
    assert one_line("a\n  b\tc ") == "a b c"
    assert one_line(ValueError("x\ny")) == "x y"
    assert one_line("abcdefghij", 8) == "abcde..." and len(one_line("x" * 500, 200)) == 200
    assert one_line("short", 8) == "short"
    assert str(RequestFailed("two\nlines")) == "two lines"
