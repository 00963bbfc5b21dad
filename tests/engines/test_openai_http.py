"""The openai engine against a real local HTTP server that plays scripted SSE streams.

Each scripted behaviour is picked by the request's model name, so one server covers the
good stream, malformed events, a dropped connection, HTTP errors, a timeout and reasoning.
"""

from __future__ import annotations

import http.server
import json
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest

from engines.base import GenerationRequest, SamplingParams, create_engine, timed_stream
from engines.errors import EngineUnavailable
from engines.openai_http import iter_sse_data


def _event(obj: Any) -> bytes:
    return f"data: {json.dumps(obj)}\n\n".encode()


def _text_chunk(text: str, **extra: Any) -> dict[str, Any]:
    return {"choices": [{"index": 0, "text": text, "finish_reason": None, **extra}]}


USAGE = {"choices": [], "usage": {"prompt_tokens": 7, "completion_tokens": 3, "total_tokens": 10}}


class _Handler(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    seen: list[dict[str, Any]] = []  # noqa: RUF012 - shared record of requests, read by tests
    headers_seen: list[dict[str, str]] = []  # noqa: RUF012

    def log_message(self, *args: Any) -> None:
        pass

    def do_GET(self) -> None:
        if self.path == "/v1/models":
            self._json(200, {"object": "list", "data": [{"id": "good"}, {"id": "reasoner"}]})
        else:
            self._json(404, {"error": {"message": "not found"}})

    def _json(self, code: int, obj: Any) -> None:
        body = json.dumps(obj).encode()
        self.send_response(code)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def _start_sse(self) -> None:
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.send_header("Connection", "close")
        self.end_headers()

    def do_POST(self) -> None:
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        type(self).seen.append(body)
        type(self).headers_seen.append(dict(self.headers))
        model = body["model"]
        if model == "http500":
            self._json(500, {"error": {"message": "CUDA out of memory", "type": "InternalServerError"}})
            return
        if model == "slow":
            time.sleep(2.0)
        self._start_sse()
        w = self.wfile.write
        if model in ("good", "slow"):
            w(b": ping\n\n")
            w(_event(_text_chunk("Hel")))
            w(b"data: " + json.dumps(_text_chunk("lo")).encode() + b"\r\n\r\n")
            w(_event(_text_chunk("", finish_reason=None)))  # an invisible token
            w(_event(USAGE))
            w(b"data: [DONE]\n\n")
        elif model == "counted":
            for i, ids in enumerate(([5], [6, 7], [8])):
                w(_event({**_text_chunk("x"), "usage": {"completion_tokens": [1, 3, 4][i]}}))
                del ids
            w(_event({"choices": [{"index": 0, "text": "y", "token_ids": [1, 2]}]}))
            w(b"data: [DONE]\n\n")
        elif model == "malformed":
            w(_event(_text_chunk("ok")))
            w(b"data: {not json\n\n")
        elif model == "dropped":
            w(_event(_text_chunk("partial")))
            self.wfile.flush()
            self.close_connection = True
        elif model == "error-event":
            w(_event(_text_chunk("a")))
            w(_event({"error": {"message": "engine died", "code": 500}}))
        elif model == "reasoner":
            w(_event({"choices": [{"index": 0, "delta": {"role": "assistant", "content": ""}}]}))
            w(_event({"choices": [{"index": 0, "delta": {"reasoning_content": "think"}}]}))
            w(_event({"choices": [{"index": 0, "delta": {"reasoning": "more"}}]}))
            w(_event({"choices": [{"index": 0, "delta": {"content": "answer"}}]}))
            w(_event({"choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}]}))
            w(_event({"choices": [], "usage": {"prompt_tokens": 3, "completion_tokens": 3}}))
            w(b"data: [DONE]\n\n")
        elif model == "endless":
            for _ in range(200):
                w(_event(_text_chunk("t")))
                self.wfile.flush()
                time.sleep(0.02)
            w(b"data: [DONE]\n\n")


@pytest.fixture(scope="module")
def server() -> Iterator[str]:
    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Handler)
    httpd.daemon_threads = True
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{httpd.server_address[1]}/v1"
    httpd.shutdown()
    httpd.server_close()


def _engine(url: str, model: str = "good", **opts: Any) -> Any:
    engine = create_engine({"kind": "openai", "model": model, "base_url": url, "check_model": False, **opts})
    engine.start()
    return engine


def _req(max_tokens: int = 3) -> GenerationRequest:
    return GenerationRequest("r0", "Hi", SamplingParams(max_tokens=max_tokens))


def test_iter_sse_data_follows_the_format() -> None:
    lines = [": comment", "event: x", "data: a", "data:b", "", "", "id: 3", "data: {}", "", "data: tail"]
    assert list(iter_sse_data(iter(lines))) == ["a\nb", "{}", "tail"]


def test_good_stream_chunks_usage_and_request_body(server: str) -> None:
    engine = _engine(server, max_connections=8)
    chunks = list(engine.stream(_req()))
    assert [(c.text, c.tokens) for c in chunks[:3]] == [("Hel", 1), ("lo", 1), ("", 1)]
    final = chunks[-1]
    assert final.final and final.tokens == 0 and final.prompt_tokens == 7 and final.usage_output_tokens == 3
    body = _Handler.seen[-1]
    assert body["stream"] is True and body["stream_options"] == {"include_usage": True}
    assert body["ignore_eos"] is True and body["min_tokens"] == 3 and body["max_tokens"] == 3
    res = timed_stream(engine, _req())
    assert res.error is None and res.text == "Hello" and res.output_tokens == 3 == res.usage_output_tokens
    assert res.prompt_tokens == 7 and len(res.chunks) == 3
    engine.stop()


def test_server_token_counts_are_used(server: str) -> None:
    engine = _engine(server, model="counted", server_token_counts=True)
    chunks = list(engine.stream(_req()))
    assert [c.tokens for c in chunks] == [1, 2, 1, 2]
    assert _Handler.seen[-1]["stream_options"]["continuous_usage_stats"] is True
    engine.stop()


@pytest.mark.parametrize(
    ("model", "expected"),
    [
        ("malformed", "malformed SSE event (not JSON): {not json"),
        ("dropped", "ended before [DONE]"),
        ("error-event", "server error mid-stream: engine died"),
        ("http500", "HTTP 500 from http://127.0.0.1:"),
    ],
)
def test_failures_become_one_line_reasons(server: str, model: str, expected: str) -> None:
    engine = _engine(server, model=model)
    res = timed_stream(engine, _req())
    assert res.error is not None and expected in res.error, res.error
    assert "\n" not in res.error and res.error.startswith(("RequestFailed", "SSEError"))
    if model == "http500":
        assert "CUDA out of memory" in res.error
    engine.stop()


def test_timeout(server: str) -> None:
    engine = _engine(server, model="slow", timeout_s=0.5)
    res = timed_stream(engine, _req())
    assert res.error is not None and "timed out waiting for" in res.error
    engine.stop()


def test_reasoning_chunks(server: str) -> None:
    engine = _engine(server, model="reasoner", endpoint="chat")
    chunks = list(engine.stream(_req()))
    body = _Handler.seen[-1]
    assert body["messages"] == [{"role": "user", "content": "Hi"}] and body["max_completion_tokens"] == 3
    kinds = [(c.text, c.tokens, c.reasoning) for c in chunks if not c.final]
    assert kinds == [("think", 1, True), ("more", 1, True), ("answer", 1, False)]
    res = timed_stream(engine, _req())
    assert res.reasoning_tokens == 2 and res.output_tokens == 3 and res.text == "answer"
    assert res.first_any is not None and res.first_any < res.chunks[0].t
    engine.stop()


def test_cancel_stops_reading(server: str) -> None:
    engine = _engine(server, model="endless")
    cancel = threading.Event()
    got = 0
    t0 = time.perf_counter()
    for chunk in engine.stream(_req(200), cancel):
        got += chunk.tokens
        if got == 3:
            cancel.set()
    assert got == 3 and time.perf_counter() - t0 < 2.0
    engine.stop()


def test_api_key_from_env_only(server: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("MOEBENCH_OPENAI_API_KEY", "sk-secret-123")
    engine = _engine(server)
    list(engine.stream(_req()))
    assert _Handler.headers_seen[-1]["Authorization"] == "Bearer sk-secret-123"
    dumped = json.dumps(engine.options.model_dump()) + json.dumps(engine.describe())
    assert "sk-secret" not in dumped and engine.describe()["api_key_set"] is True
    engine.stop()


def test_model_check_and_unreachable_server(server: str) -> None:
    engine = create_engine({"kind": "openai", "model": "nope", "base_url": server})
    with pytest.raises(EngineUnavailable, match=r"model 'nope' is not served at .*; it serves: good, reasoner"):
        engine.start()
    engine.stop()
    bad = create_engine({"kind": "openai", "model": "good", "base_url": "http://127.0.0.1:9/v1"})
    with pytest.raises(
        EngineUnavailable, match=r"cannot reach the OpenAI-compatible server at http://127\.0\.0\.1:9/v1"
    ):
        bad.start()
    bad.stop()


def test_tokenizer_counts_delta_text(server: str, tiny_model: Any) -> None:
    engine = _engine(server, tokenizer=str(tiny_model))
    assert engine.tokenizer() is not None
    chunks = list(engine.stream(_req()))
    tok = engine.tokenizer()
    assert chunks[0].tokens == len(tok.encode("Hel", add_special_tokens=False))
    engine.stop()


def test_text_counter_matches_whole_text_counting_on_a_long_stream(tiny_model: Any) -> None:
    """The windowed count equals re-encoding the whole text after every delta (the old, quadratic way)."""
    import random

    from transformers import AutoTokenizer

    from engines.openai_http import TextCounter

    tok = AutoTokenizer.from_pretrained(str(tiny_model))
    rng = random.Random(0)
    ids = [rng.randrange(100, tok.vocab_size) for _ in range(600)]
    deltas = [tok.decode([i]) for i in ids]  # one token per chunk, as servers stream them
    deltas[5] = ""  # a special token: no text, still a token
    counter = TextCounter(tok)
    got = [counter.add(d, True) for d in deltas]
    text, counted, want = "", 0, []
    for d in deltas:
        text += d.replace("\ufffd", "")
        total = len(tok.encode(text, add_special_tokens=False))
        want.append(max(total - counted, 1))
        counted += want[-1]
    assert sum(got) == sum(want) and got == want
    assert sum(got) >= len(deltas)  # every chunk that stands for a token counts at least one


def test_iter_lines_splits_bytes_across_chunk_edges() -> None:
    from engines.openai_http import iter_lines

    text = 'data: {"text": "金融"}\r\n\r\ndata: [DONE]\n\n'.encode()
    # Every split point, including inside the multi-byte characters and the \r\n.
    for cut in range(1, len(text)):
        lines = list(iter_lines([text[:cut], b"", text[cut:]]))
        assert lines == ['data: {"text": "金融"}\r', "\r", "data: [DONE]", ""], cut
    assert list(iter_lines([b"no newline at the end"])) == ["no newline at the end"]
    assert list(iter_sse_data(iter_lines([text]))) == ['{"text": "金融"}', "[DONE]"]
