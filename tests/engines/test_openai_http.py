"""The openai engine against a real local HTTP server that plays scripted SSE streams.

Each scripted behaviour is picked by the request's model name, so one server covers the
good stream, malformed events, a dropped connection, HTTP errors, a timeout and reasoning.
"""

from __future__ import annotations

import asyncio
import http.server
import json
import sys
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest

from engines.base import GenerationRequest, SamplingParams, TimedResult, create_engine, timed_astream, timed_stream
from engines.errors import EngineUnavailable
from engines.sse import SSEDecoder, sse_payloads


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
        if self.path not in ("/v1/completions", "/v1/chat/completions"):  # no /tokenize here
            self._json(404, {"error": {"message": "not found"}})
            return
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
        elif model == "huge-event":  # one event of 6 MiB of text: bounded, not read into memory whole
            w(b'data: {"choices": [{"index": 0, "text": "' + b" a" * (3 * 2**20) + b'"}]}\n\n')
            w(b"data: [DONE]\n\n")
        elif model == "too-much":  # valid events far past max_tokens
            for _ in range(300):
                w(_event(_text_chunk("t")))
            w(b"data: [DONE]\n\n")
        elif model == "keepalive":  # one token, then an SSE comment every 0.2 s, never [DONE]
            w(_event(_text_chunk("Hi")))
            while True:  # until the client hangs up (BrokenPipeError, ignored by _Server)
                self.wfile.flush()
                time.sleep(0.2)
                w(b": keep-alive\n\n")
        elif model == "endless":
            for _ in range(200):
                w(_event(_text_chunk("t")))
                self.wfile.flush()
                time.sleep(0.02)
            w(b"data: [DONE]\n\n")


class _Server(http.server.ThreadingHTTPServer):
    def handle_error(self, request: Any, client_address: Any) -> None:
        if isinstance(sys.exc_info()[1], (BrokenPipeError, ConnectionResetError)):
            return  # a client that hung up on purpose (timeout and cancel tests)
        super().handle_error(request, client_address)


@pytest.fixture(scope="module")
def server() -> Iterator[str]:
    httpd = _Server(("127.0.0.1", 0), _Handler)
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


CLIENTS = ("threads", "asyncio")


def _timed(engine: Any, req: GenerationRequest, client: str, cancel: threading.Event | None = None) -> TimedResult:
    """One request through the threaded client (timed_stream) or the asyncio one (timed_astream)."""
    if client == "threads":
        return timed_stream(engine, req, cancel)

    async def one() -> TimedResult:
        await engine.aopen()
        try:
            return await timed_astream(engine, req, cancel)
        finally:
            await engine.aclose()

    assert engine.async_capable()
    return asyncio.run(one())


def test_sse_decoder_follows_the_format() -> None:
    lines = [": comment", "event: x", "data: a", "data:b", "", "", "id: 3", "data: {}", "", "data: tail"]
    assert list(sse_payloads([("\n".join(lines)).encode()])) == ["a\nb", "{}", "tail"]
    decoder = SSEDecoder()
    assert [decoder.line(x) for x in lines[:5]] == [None, None, None, None, "a\nb"]


def test_good_stream_chunks_usage_and_request_body(server: str) -> None:
    engine = _engine(server, max_connections=8)
    chunks = list(engine.stream(_req()))
    assert [(c.text, c.tokens) for c in chunks[:3]] == [("Hel", 1), ("lo", 1), ("", 1)]
    final = chunks[-1]
    assert final.final and final.tokens == 0 and final.prompt_tokens == 7 and final.usage_output_tokens == 3
    body = _Handler.seen[-1]
    assert body["stream"] is True and body["stream_options"] == {"include_usage": True}
    assert body["ignore_eos"] is True and body["min_tokens"] == 3 and body["max_tokens"] == 3
    for client in CLIENTS:
        res = _timed(engine, _req(), client)
        assert res.error is None and res.text == "Hello" and res.output_tokens == 3 == res.usage_output_tokens
        assert res.prompt_tokens == 7 and len(res.chunks) == 3, client
        assert _Handler.seen[-1] == body  # both clients send the same request
    engine.stop()


def test_server_token_counts_are_used(server: str) -> None:
    engine = _engine(server, model="counted", server_token_counts=True)
    chunks = list(engine.stream(_req()))
    assert [c.tokens for c in chunks] == [1, 2, 1, 2]
    assert _Handler.seen[-1]["stream_options"]["continuous_usage_stats"] is True
    assert [c.tokens for c in _timed(engine, _req(), "asyncio").chunks] == [1, 2, 1, 2]
    engine.stop()


@pytest.mark.parametrize(
    ("model", "expected"),
    [
        ("malformed", "malformed SSE event (not JSON): {not json"),
        ("dropped", "ended before [DONE]"),
        ("error-event", "server error mid-stream: engine died"),
        ("http500", "HTTP 500 from http://127.0.0.1:"),
        ("huge-event", "an SSE line over 4 MiB: stopped reading"),
        ("too-much", "the server sent more than 67 output tokens for max_tokens=3: stopped reading"),
    ],
)
@pytest.mark.parametrize("client", CLIENTS)
def test_failures_become_one_line_reasons(server: str, model: str, expected: str, client: str) -> None:
    engine = _engine(server, model=model)
    res = _timed(engine, _req(), client)
    assert res.error is not None and expected in res.error, res.error
    assert "\n" not in res.error and res.error.startswith(("RequestFailed", "SSEError"))
    assert len(res.chunks) <= 68  # reading stopped at the chunk that crossed the limit
    if model == "http500":
        assert "CUDA out of memory" in res.error
    engine.stop()


@pytest.mark.parametrize("client", CLIENTS)
def test_timeout(server: str, client: str) -> None:
    engine = _engine(server, model="slow", timeout_s=0.5)  # no headers for 2 s
    res = _timed(engine, _req(), client)
    assert res.error == "RequestFailed: request exceeded its 0.5 s deadline (option timeout_s)", res.error
    engine.stop()


@pytest.mark.parametrize("via", ["env", "option"])
@pytest.mark.parametrize("client", CLIENTS)
def test_keep_alive_comments_do_not_outlive_the_request_deadline(
    server: str, client: str, via: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A server that sends `: keep-alive` every 0.2 s forever: the total deadline still ends
    the request (the per-read timeout never would), and what arrived is kept."""
    if via == "env":
        monkeypatch.setenv("MOEBENCH_REQUEST_TIMEOUT_S", "1")
        engine, source = _engine(server, model="keepalive"), "MOEBENCH_REQUEST_TIMEOUT_S"
    else:
        engine, source = _engine(server, model="keepalive", timeout_s=1), "option timeout_s"
    t0 = time.perf_counter()
    res = _timed(engine, _req(), client)
    elapsed = time.perf_counter() - t0
    assert res.error == f"RequestFailed: request exceeded its 1 s deadline ({source})", res.error
    assert 0.9 < elapsed < 2.0, elapsed
    assert res.text == "Hi" and res.output_tokens == 1 and len(res.chunks) == 1  # the timed result keeps it
    engine.stop()


@pytest.mark.parametrize("client", CLIENTS)
def test_first_byte_timeout(server: str, client: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("MOEBENCH_FIRST_BYTE_TIMEOUT_S", "0.5")
    engine = _engine(server, model="slow")  # headers after 2 s; the total stays 600 s
    t0 = time.perf_counter()
    res = _timed(engine, _req(), client)
    assert res.error is not None and res.error.endswith("within 0.5 s (MOEBENCH_FIRST_BYTE_TIMEOUT_S)"), res.error
    assert res.error.startswith("RequestFailed: no response from http://127.0.0.1:")
    assert time.perf_counter() - t0 < 1.5
    engine.stop()


def test_reasoning_chunks(server: str) -> None:
    engine = _engine(server, model="reasoner", endpoint="chat")
    chunks = list(engine.stream(_req()))
    body = _Handler.seen[-1]
    assert body["messages"] == [{"role": "user", "content": "Hi"}] and body["max_completion_tokens"] == 3
    kinds = [(c.text, c.tokens, c.reasoning) for c in chunks if not c.final]
    assert kinds == [("think", 1, True), ("more", 1, True), ("answer", 1, False)]
    for client in CLIENTS:
        res = _timed(engine, _req(), client)
        assert res.reasoning_tokens == 2 and res.output_tokens == 3 and res.text == "answer", client
        # every output chunk is timed, reasoning first: the answer's chunk is the third
        assert [c.reasoning for c in res.chunks] == [True, True, False], client
        assert res.first_any == res.chunks[0].t and res.first_any < res.chunks[2].t, client
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

    async def cancel_after_three() -> int:
        cancel.clear()
        seen = 0
        await engine.aopen()
        try:
            async for chunk in engine.astream(_req(200), cancel):
                seen += chunk.tokens
                if seen == 3:
                    cancel.set()
        finally:
            await engine.aclose()
        return seen

    t0 = time.perf_counter()
    assert asyncio.run(cancel_after_three()) == 3 and time.perf_counter() - t0 < 2.0
    engine.stop()


def test_api_key_from_env_only(server: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("MOEBENCH_OPENAI_API_KEY", "sk-secret-123")
    engine = _engine(server)
    for client in CLIENTS:
        assert _timed(engine, _req(), client).error is None
        assert _Handler.headers_seen[-1]["Authorization"] == "Bearer sk-secret-123", client
    dumped = json.dumps(engine.options.model_dump()) + json.dumps(engine.describe())
    assert "sk-secret" not in dumped and engine.describe()["api_key_set"] is True
    assert engine.describe()["api_key"] == "sent"  # 127.0.0.1 is in the default MOEBENCH_API_KEY_HOSTS
    engine.stop()


def test_api_key_goes_only_to_the_allowed_hosts(server: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """One server, two host names: the key reaches it as 127.0.0.1 (allowed), not as localhost."""
    monkeypatch.setenv("OPENAI_API_KEY", "sk-secret-456")
    monkeypatch.setenv("MOEBENCH_API_KEY_HOSTS", " 127.0.0.1 , api.example.com")
    allowed = _engine(server)
    other = _engine(server.replace("127.0.0.1", "localhost"))
    for client in CLIENTS:
        assert _timed(allowed, _req(), client).error is None
        assert _Handler.headers_seen[-1]["Authorization"] == "Bearer sk-secret-456", client
        assert _timed(other, _req(), client).error is None
        assert "Authorization" not in _Handler.headers_seen[-1], client
    assert allowed.describe()["api_key"] == "sent"
    assert other.describe()["api_key"] == "withheld: host localhost not in MOEBENCH_API_KEY_HOSTS"
    assert "sk-secret" not in json.dumps(other.describe())
    monkeypatch.setenv("MOEBENCH_API_KEY_HOSTS", "*")
    assert other.describe()["api_key"] == "sent"
    monkeypatch.delenv("OPENAI_API_KEY")
    monkeypatch.delenv("MOEBENCH_OPENAI_API_KEY", raising=False)
    assert other.describe()["api_key"] == "not set"
    allowed.stop()
    other.stop()


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

    from engines.tokens import TextCounter

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


def test_sse_decoder_splits_bytes_across_chunk_edges() -> None:
    text = 'data: {"text": "金融"}\r\n\r\ndata: [DONE]\n\n'.encode()
    # Every split point, including inside the multi-byte characters and the \r\n.
    for cut in range(1, len(text)):
        decoder = SSEDecoder()
        first = decoder.feed(text[:cut])
        payloads = first + decoder.feed(b"") + decoder.feed(text[cut:]) + decoder.close()
        assert payloads == ['{"text": "金融"}', "[DONE]"], cut
        assert first == (['{"text": "金融"}'] if cut >= text.index(b"\r\n\r\n") + 4 else []), cut
    assert list(sse_payloads([b"data: no newline at the end"])) == ["no newline at the end"]


def _run_config(url: str, model: str, client: str, **kw: Any) -> Any:
    from bench.config import RunConfig

    engine = {"kind": "openai", "model": model, "base_url": url, "check_model": False}
    base: dict[str, Any] = {
        "engine": {**engine, "async_client": client == "asyncio"},
        "mode": "concurrency",
        "workload": {"source": "builtin", "output_len": 3},
        "requests": 12,
        "concurrency": 4,
        "server_metrics": False,
        "warmup": 0,  # the scripted models answer slowly or fail on purpose
    }
    base.update(kw)
    return RunConfig.build(**base)


@pytest.mark.parametrize("client", CLIENTS)
def test_runner_sends_from_a_sender_process(server: str, store: Any, client: str) -> None:
    import multiprocessing

    from bench.run.manager import start_run

    default_interval = sys.getswitchinterval()
    job = start_run(_run_config(server, "slow", client, requests=4), store)
    deadline = time.time() + 20
    while time.time() < deadline and job.snapshot().in_flight < 4:
        time.sleep(0.05)
    names = [t.name for t in threading.enumerate() if t.name.startswith(f"run{job.run_id}-")]
    senders = [p.name for p in multiprocessing.active_children()]
    interval_during = sys.getswitchinterval()
    snap = job.wait(30)
    assert snap.status == "completed" and snap.done == 4 and snap.failed == 0, snap.error
    # The requests go out from a child process (threads or asyncio inside it); this process
    # only records and samples, and its interpreter settings stay as they were.
    assert "moebench-sender-0" in senders
    assert sorted(names) == [f"run{job.run_id}-recorder", f"run{job.run_id}-sampler"]
    assert interval_during == default_interval == sys.getswitchinterval()
    recs = store.records(snap.run_id)
    assert all(r.ok and r.output_tokens == 3 == r.usage_output_tokens and r.ttft_ms >= 1900 for r in recs)
    # The first sample comes early (the four requests in flight), and a last output-rate
    # point covers the final partial interval.
    in_flight = store.timeseries(snap.run_id, ["in_flight"])
    assert in_flight[1][0] <= 0.5 and in_flight[1][2] == 4.0
    rate = store.timeseries(snap.run_id, ["output_tok_s"])
    assert rate[-1][0] >= 1.9 and rate[-1][2] > 0
    # The first wave left together, the client's set-up (aopen) done before the clock started.
    assert max(r.start_s for r in recs) < 0.1 and max(r.send_lag_ms for r in recs) < 100

    job = start_run(_run_config(server, "good", client, request_rate=40.0), store)
    snap = job.wait(30)
    assert snap.status == "completed" and snap.done == 12 and snap.failed == 0, snap.error
    run = store.get_run(snap.run_id)
    assert run.summary.request_rate == 40.0 and run.summary.output_tokens == 36
    recs = store.records(snap.run_id)
    assert all(r.send_lag_ms is not None for r in recs) and max(r.start_s for r in recs) > 0.05


@pytest.mark.parametrize("model", ["endless", "slow"])
def test_async_run_cancel_ends_in_flight_requests(server: str, store: Any, model: str) -> None:
    """Streaming requests stop at their next chunk; requests still waiting for a silent
    server (``slow`` answers after 2 s) are ended by cancelling their tasks."""
    from bench.run.manager import start_run

    workload = {"source": "builtin", "output_len": 200}
    job = start_run(_run_config(server, model, "asyncio", requests=6, concurrency=2, workload=workload), store)
    deadline = time.time() + 10
    while time.time() < deadline and job.snapshot().in_flight < 2:
        time.sleep(0.05)
    time.sleep(0.3)
    t_cancel = time.perf_counter()
    job.cancel()
    snap = job.wait(5)
    assert time.perf_counter() - t_cancel < 1.5
    assert snap.status == "cancelled"
    recs = store.records(snap.run_id)
    assert len(recs) == 2 and all(r.error == "cancelled" for r in recs)
    assert all((r.output_tokens > 0) == (model == "endless") for r in recs)


def test_async_run_records_mid_run_failures_and_goes_on(server: str, store: Any) -> None:
    from bench.run.manager import start_run

    job = start_run(_run_config(server, "malformed", "asyncio", requests=5, concurrency=2), store)
    snap = job.wait(30)
    assert snap.done == 5 and snap.failed == 5  # each failure ended its request, not the run
    assert snap.status == "failed" and "every request failed; first error: SSEError: malformed" in (snap.error or "")
    recs = store.records(snap.run_id)
    assert all(r.error and "malformed SSE event" in r.error for r in recs)


def test_sse_decoder_bounds_lines_and_events() -> None:
    from engines.sse import SSEDecoder, SSEError

    dec = SSEDecoder(max_event_bytes=100)
    assert dec.feed(b"data: " + b"x" * 90 + b"\n\n") == ["x" * 90]
    with pytest.raises(SSEError, match="an SSE line over"):
        SSEDecoder(max_event_bytes=100).feed(b"data: " + b"x" * 200)  # no newline yet: still refused
    many = SSEDecoder(max_event_bytes=100)
    with pytest.raises(SSEError, match="an SSE event over"):
        many.feed(b"data: " + b"y" * 60 + b"\ndata: " + b"y" * 60 + b"\n")  # two lines of one event
