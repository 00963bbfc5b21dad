"""Property tests (hypothesis) of the two parsers that read what others wrote: the SSE
decoder (:mod:`engines.sse`) and the JSONL prompt reader (:mod:`bench.workloads`).

- A valid event stream cut into any chunks gives the same payloads as in one chunk, and
  the payloads the stream was built from.
- Any bytes, in any chunks, either give payloads no longer than the decoder's limit or
  raise :class:`SSEError` (a :class:`RequestFailed`): never another exception.
- Any text given to the JSONL reader either gives items with non-empty string prompts
  or raises :class:`WorkloadError` with a one-line message; the upload path
  (``parse_jsonl``) and the file path (``read_jsonl``) agree.
Each property runs 200 examples, without deadline (the machine is shared).
"""

from __future__ import annotations

import itertools
import json
import tempfile
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from bench.workloads import parse_jsonl, read_jsonl
from engines.errors import RequestFailed, WorkloadError
from engines.sse import SSEDecoder, SSEError, sse_payloads

# No example database: nothing is written into the checkout.
FUZZ = settings(max_examples=200, deadline=None, database=None, suppress_health_check=[HealthCheck.too_slow])
SMALL_LIMIT = 16  # a decoder limit small enough for hypothesis to reach with short inputs


# --- the SSE decoder ----------------------------------------------------------------------

# A field value: any text without a line break (the decoder splits lines on \n only, so a
# lone \r inside a value is excluded too: a spec decoder would break the line there).
values = st.text(st.characters(blacklist_characters="\r\n", blacklist_categories=("Cs",)), max_size=40)
other_lines = st.one_of(
    st.builds(lambda v: ":" + v, values),  # a comment
    st.sampled_from(["event: message", "id: 7", "retry: 1000", "event:", "id"]),
    st.builds(lambda v: "x-custom: " + v, values),  # an unknown field: ignored
)


@st.composite
def sse_streams(draw: Any) -> tuple[bytes, list[str]]:
    """A valid event stream and the payloads a decoder must give for it."""
    lines: list[str] = []
    expected: list[str] = []
    for _ in range(draw(st.integers(0, 6))):
        data: list[str] = []
        for _ in range(draw(st.integers(0, 4))):
            if draw(st.booleans()):
                lines.append(draw(other_lines))
            value = draw(values)
            form = draw(st.sampled_from(["data: ", "data:", "data"]))
            if form == "data" and value:
                form = "data:"
            lines.append(form + value)
            # "data:" without a space: a value that starts with a space loses that one space.
            data.append(value[1:] if form == "data:" and value.startswith(" ") else value)
        if draw(st.booleans()):
            lines.append(draw(other_lines))
        lines.append("")  # the blank line that ends the event
        if data:
            expected.append("\n".join(data))
    eol = draw(st.sampled_from(["\n", "\r\n"]))
    text = eol.join(lines) + (eol if lines else "")
    if lines and draw(st.booleans()):
        text = text[: -len(eol)]  # no line break after the last blank line: close() still ends the event
    return text.encode("utf-8"), expected


cut_points = st.lists(st.integers(0, 2000), max_size=12)


def split(data: bytes, cuts: list[int]) -> list[bytes]:
    """``data`` cut at ``cuts`` (modulo its length; multi-byte characters may be cut too)."""
    bounds = [0, *sorted(c % (len(data) + 1) for c in cuts), len(data)]
    return [data[a:b] for a, b in itertools.pairwise(bounds)]


def decode(chunks: list[bytes], limit: int | None = None) -> list[str]:
    decoder = SSEDecoder(limit)
    out = []
    for chunk in chunks:
        out.extend(decoder.feed(chunk))
    out.extend(decoder.close())
    return out


@FUZZ
@given(stream=sse_streams(), cuts=cut_points)
def test_any_chunking_of_a_valid_stream_gives_its_payloads(stream: tuple[bytes, list[str]], cuts: list[int]) -> None:
    raw, expected = stream
    assert list(sse_payloads([raw])) == expected
    assert decode(split(raw, cuts)) == expected
    assert decode([raw[i : i + 1] for i in range(len(raw))]) == expected  # a byte at a time


def test_a_stream_with_bare_cr_line_ends_decodes_as_with_lf() -> None:
    """The SSE spec ends lines with CRLF, LF or a lone CR; the property above draws the first
    two, this checks the third."""
    lf = b'data: {"a": 1}\n\n: comment\ndata: x\ndata: y\n\n'
    assert decode([lf]) == ['{"a": 1}', "x\ny"]
    assert decode([lf.replace(b"\n", b"\r")]) == decode([lf])


# Arbitrary bytes, and bytes built from the pieces of SSE, each repeated up to 40 times, so
# that long events, long lines, runs of empty data lines and stray \r reach the limits.
piece = st.sampled_from([b"data:", b"data: ", b"data", b"data\n", b"\n", b"\r\n", b"\r", b":", b" ", b"x" * 7,
                         b"\xff\xfe", "é".encode(), b"id: 1", b"event: e", b"\n\n", b"[DONE]", b"{}"])  # fmt: skip
sse_pieces = st.lists(st.tuples(piece, st.integers(1, 40)).map(lambda t: t[0] * t[1]), max_size=12).map(b"".join)
any_bytes = st.one_of(st.binary(max_size=400), sse_pieces)


def check_bounded(chunks: list[bytes]) -> None:
    """Decoding ``chunks`` gives payloads within the limit, or raises a one-line SSEError."""
    try:
        payloads = decode(chunks, SMALL_LIMIT)
    except SSEError as exc:
        assert isinstance(exc, RequestFailed) and "\n" not in str(exc)
        return
    for payload in payloads:
        assert len(payload) <= SMALL_LIMIT, f"a payload of {len(payload)} characters passed a {SMALL_LIMIT} limit"


@FUZZ
@given(raw=any_bytes, cuts=cut_points)
@example(raw=b"data\n" * 20, cuts=[3])  # an event of empty data lines: 19 line breaks
def test_any_bytes_give_bounded_payloads_or_an_sse_error(raw: bytes, cuts: list[int]) -> None:
    check_bounded(split(raw, cuts))


def test_an_event_of_empty_data_lines_is_bounded_at_the_default_limit() -> None:
    """5 M empty ``data:`` lines (31 MB, no blank line): the event the decoder holds passes
    4 MiB long before the end; it must stop as it does for any other event that size."""
    decoder = SSEDecoder()
    piece = b"data:\n" * 65_536
    with pytest.raises(SSEError, match="over 4 MiB"):
        for _ in range(80):  # 5.2 M lines
            decoder.feed(piece)


# --- the JSONL prompt reader -------------------------------------------------------------

json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=True) | st.text(max_size=20),
    lambda kids: st.lists(kids, max_size=3) | st.dictionaries(st.text(max_size=8), kids, max_size=3),
    max_leaves=8,
)
objects = st.fixed_dictionaries(
    {}, optional={"prompt": json_values | st.text(max_size=30), "output_len": json_values | st.integers(-3, 9)}
)


def _line(obj: Any) -> str:
    return json.dumps(obj, ensure_ascii=False)


lines = st.one_of(
    objects.map(_line),  # mostly valid shapes, with bad fields now and then
    json_values.map(_line),  # valid JSON, not an object
    st.text(max_size=60),  # anything
    st.sampled_from(["", "   ", "{", "[" * 3000, '{"prompt": "a\u2028b"}', '{"prompt": "\u0085"}', "\ufeff{}"]),
)
jsonl_texts = st.lists(lines, max_size=6).map("\n".join)


def _check_items(items: list[dict[str, Any]]) -> None:
    assert items
    for item in items:
        assert isinstance(item["prompt"], str) and item["prompt"].strip()
        n = item["output_len"]
        assert n is None or (type(n) is int and n >= 1)


def _outcome(fn: Any, *args: Any) -> tuple[str, Any]:
    """("ok", items) or ("error", message); anything but WorkloadError propagates."""
    try:
        items = fn(*args)
    except WorkloadError as exc:
        assert "\n" not in str(exc) and str(exc), repr(str(exc))
        return "error", str(exc)
    _check_items(items)
    return "ok", items


@FUZZ
@given(text=jsonl_texts)
@example(text="[" * 3000)  # nested past the JSON parser's recursion limit
def test_any_text_parses_to_prompts_or_a_one_line_workload_error(text: str) -> None:
    _outcome(parse_jsonl, text)
    _outcome(parse_jsonl, text.encode("utf-8"))


@FUZZ
@given(text=jsonl_texts)
@example(text='{"prompt": "one\u2028two"}')  # a JSON string may hold U+2028 raw; JSON Lines splits on \n only
def test_an_upload_and_a_file_of_the_same_text_give_the_same_prompts(text: str) -> None:
    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / "p.jsonl"
        path.write_bytes(text.encode("utf-8"))
        from_file = _outcome(read_jsonl, path)
    from_upload = _outcome(parse_jsonl, text)
    assert from_upload[0] == from_file[0], (from_upload, from_file)
    if from_upload[0] == "ok":
        assert from_upload[1] == from_file[1]


@FUZZ
@given(raw=st.binary(max_size=300))
def test_any_bytes_as_a_prompt_file_give_prompts_or_a_one_line_workload_error(raw: bytes) -> None:
    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / "p.jsonl"
        path.write_bytes(raw)
        _outcome(read_jsonl, path)
    _outcome(parse_jsonl, raw)
