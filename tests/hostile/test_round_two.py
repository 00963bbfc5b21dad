"""The second hostile round (issue 34): files, bundles and bodies an attacker controls. Each test
fails without its fix; the files, bundles and servers are made here."""

from __future__ import annotations

import contextlib
import json
import shutil
from pathlib import Path

import pytest

from bench.store import Store
from tests.hostile.clirun import ROOT, bench
from tests.hostile.hostile_server import MODEL, HostileServer
from tests.hostile.test_hostile_server import (
    CLIENTS,
    MAX_RSS,
    OUT,
    assert_only_r2_failed,
    mixed_prompts,
    openai_run,
)

PROFILE = ROOT / "examples" / "h100-fast-profile.json"
PROFILE_TRACE = ROOT / "examples" / "h100-fast-profile.trace.json.gz"


# --- a bundle never makes MoE Bench serve a file it did not write -------------------------


def test_a_bundle_naming_a_local_file_as_its_trace_serves_nothing(tmp_path: Path) -> None:
    """A bundle whose profile_trace names a secret file: imported, the run has no trace (CLI and
    Profiling page); the file is neither referenced nor copied."""
    from dashboard import profile_data

    secret = tmp_path / "secret.txt"
    secret.write_text("root:$6$not-for-download\n")
    bundle = json.loads(PROFILE.read_text())
    bundle["artifacts"]["profile_trace"] = {"path": str(secret)}
    path = tmp_path / "evil.json"
    path.write_text(json.dumps(bundle))
    db = tmp_path / "db.sqlite"
    r = bench("import", str(path), "--db", str(db), data_dir=tmp_path)
    assert r.returncode == 0, r.stderr
    store = Store(db)
    (run,) = store.list_runs()
    assert store.artifact(run.id, "profile_trace") is None and store.trace_path(run.id) is None
    assert profile_data.trace_file(store, run.id).exists is False
    assert not store.traces_dir.exists() or not any(store.traces_dir.iterdir())
    # an artifact written straight into the store (an older file, a hand edit) is not served either
    store.put_artifact(run.id, "profile_trace", {"path": str(secret)})
    assert store.trace_path(run.id) is None and profile_data.trace_file(store, run.id).exists is False


def test_a_trace_beside_a_bundle_is_copied_in_and_a_link_is_refused(tmp_path: Path) -> None:
    src = tmp_path / "in"
    src.mkdir()
    shutil.copy(PROFILE, src / "p.json")
    shutil.copy(PROFILE_TRACE, src / "p.trace.json.gz")
    db = tmp_path / "db.sqlite"
    assert bench("import", str(src / "p.json"), "--db", str(db), data_dir=tmp_path).returncode == 0
    store = Store(db)
    (run,) = store.list_runs()
    kept = store.trace_path(run.id)
    assert kept is not None and kept.parent == store.traces_dir and kept.read_bytes() == PROFILE_TRACE.read_bytes()
    (src / "p.trace.json.gz").unlink()  # the copy stays the run's
    assert store.trace_path(run.id) == kept
    # a symlink beside the bundle (to a file the user did not mean to share) is not followed
    secret = tmp_path / "secret.txt"
    secret.write_text("secret")
    (src / "p.trace.json.gz").symlink_to(secret)
    again = json.loads((src / "p.json").read_text())
    again["run"]["name"] = "the profile again"  # another bundle: the same one twice is one run (content hash)
    (src / "p.json").write_text(json.dumps(again))
    assert bench("import", str(src / "p.json"), "--db", str(db), data_dir=tmp_path).returncode == 0
    newest = store.list_runs()[0]
    assert newest.id != run.id and store.trace_path(newest.id) is None
    assert all(p.read_bytes() != b"secret" for p in store.traces_dir.iterdir())
    # a link planted inside the traces folder is not served either
    link = store.traces_dir / "planted.trace.json"
    link.symlink_to(secret)
    store.put_artifact(newest.id, "profile_trace", {"path": str(link)})
    assert store.trace_path(newest.id) is None


# --- bodies are read with a cap on their decoded bytes -------------------------------------

BOMB_CASES = [
    ("gzip_error", "RequestFailed: HTTP 500 from {url}/completions: "),
    ("gzip_newlines", "SSEError: 16 MiB of the event stream without one event: stopped reading"),
]


@pytest.mark.parametrize("client", list(CLIENTS))
@pytest.mark.parametrize(("mode", "reason"), BOMB_CASES, ids=[c[0] for c in BOMB_CASES])
def test_a_compressed_answer_is_not_inflated_past_its_cap(
    tmp_path: Path, server: HostileServer, mode: str, reason: str, client: str
) -> None:
    """2 GB behind ~2 MB of gzip: the request fails alone with its reason (the client stopped
    at its cap: 64 KiB of an error, 16 MiB of a stream without an event) and its memory stays low.
    (The whole compressed body fits the loopback sockets' buffers, so the server's byte count
    cannot show where the client stopped; the reasons do.)"""
    url = server.url()
    r, db = openai_run(url, tmp_path, mixed_prompts(mode), *CLIENTS[client])
    assert r.returncode == 1, r.stderr
    error = assert_only_r2_failed(db)
    assert error.startswith(reason.format(url=url)), error
    assert r.peak_rss < MAX_RSS, f"the CLI peaked at {r.peak_rss / 2**20:.0f} MiB"


def test_a_compressed_model_list_is_refused_at_start(tmp_path: Path, server: HostileServer) -> None:
    r, _ = openai_run(server.url("gzip_models"), tmp_path, ["good one"])
    assert r.returncode != 0
    line = r.one_error()
    assert "did not answer an OpenAI model list" in line and "over 16 MiB: not read" in line, line
    assert r.peak_rss < MAX_RSS, f"the CLI peaked at {r.peak_rss / 2**20:.0f} MiB"


# --- one request's bad usage or text is that request's, never the run's -------------------

USAGE_MODES = ["usage_nan", "usage_text", "usage_huge", "usage_negative", "surrogate"]


@pytest.mark.parametrize("client", list(CLIENTS))
@pytest.mark.parametrize("mode", USAGE_MODES)
def test_a_bad_usage_report_or_a_lone_surrogate_leaves_the_run_whole(
    tmp_path: Path, server: HostileServer, mode: str, client: str
) -> None:
    """NaN, a string, 1e29 or a negative count in a usage event (per chunk and final), or a lone
    surrogate in a delta: every request completes with its own count of tokens (the server's
    bad figure ignored), the run completes and its totals are the true ones."""
    r, db = openai_run(server.url(), tmp_path, mixed_prompts(mode), *CLIENTS[client])
    assert r.returncode == 0, r.stderr
    assert "Traceback" not in r.stderr
    store = Store(db)
    (run,) = store.list_runs()
    assert run.status == "completed" and run.summary is not None and run.summary.failed == 0
    records = {rec.request_id: rec for rec in store.records(run.id)}
    assert sorted(records) == ["r0", "r1", "r2", "r3"]
    assert all(rec.error is None and rec.output_tokens == OUT for rec in records.values()), records["r2"]
    assert run.summary.output_tokens == 4 * OUT and run.summary.output_throughput_tok_s > 0
    if mode != "surrogate":
        assert records["r2"].usage_output_tokens is None  # the server's figure was not a count
    assert server.hits[mode] == 1


def test_a_jsonl_prompt_with_a_lone_surrogate_or_a_huge_output_len_is_refused_in_one_line(
    tmp_path: Path, server: HostileServer
) -> None:
    for line, reason in (
        ({"prompt": "ok \ud800 then"}, "prompts.jsonl line 2: 'prompt' is not valid Unicode (a lone surrogate at"),
        ({"prompt": "long", "output_len": 10**9}, "prompts.jsonl line 2: 'output_len' 1000000000 is over the 32768"),
    ):
        path = tmp_path / "prompts.jsonl"
        path.write_text(json.dumps({"prompt": "fine"}) + "\n" + json.dumps(line) + "\n")
        r = bench("run", "--engine", "openai", "--base-url", server.url(), "--model", MODEL,
                  "--prompts", "jsonl", "--prompt-file", str(path), "--requests", "2", "--quiet",
                  "--db", str(tmp_path / "db.sqlite"), data_dir=tmp_path)  # fmt: skip
        assert r.returncode == 1, r.stderr  # the run is recorded as failed, with the reason
        assert reason in r.one_error(), r.one_error()


# --- one imported bundle never breaks the store -------------------------------------------


def _bundle_with(tmp_path: Path, where: str, key: str, value: object) -> Path:
    bundle = json.loads(PROFILE.read_text())
    if where == "run":
        bundle["run"][key] = value
    elif where == "summary":
        summary = json.loads(bundle["run"]["summary_json"])
        summary[key] = value
        bundle["run"]["summary_json"] = json.dumps(summary)
    else:
        bundle["samples"][0][key] = value
    path = tmp_path / f"bad-{where}-{key}.json"
    path.write_text(json.dumps(bundle))
    return path


BAD_VALUES = [
    ("sample", "ttft_ms", "fast", "sample 0 has ttft_ms 'fast', not a number"),
    ("sample", "output_tokens", -5, "sample 0 has output_tokens '-5', not a count"),
    ("sample", "chunk_times_json", '[1, "x"]', "sample 0 has chunk_times_json that is not a list of numbers"),
    ("run", "created_at", "yesterday", "the run's created_at is 'yesterday', not a time (seconds since 1970"),
    ("run", "created_at", 1e308, "the run's created_at is '1e+308', not a time"),
    ("summary", "ttft_ms", "12 ms", "the run's summary_json is not a run summary"),
    (
        "summary",
        "ttft_ms",
        {
            "count": 1,
            "mean": {"nested": 1},
            "std": None,
            "min": None,
            "max": None,
            "p50": None,
            "p90": None,
            "p95": None,
            "p99": None,
        },
        "has ttft_ms.mean",
    ),
    ("summary", "duration_s", "long", "has duration_s 'long', not a number"),
]


@pytest.mark.parametrize(("where", "key", "value", "reason"), BAD_VALUES, ids=[f"{c[0]}-{c[1]}" for c in BAD_VALUES])
def test_a_bundle_with_a_wrong_type_is_refused_and_the_store_still_lists(
    tmp_path: Path, where: str, key: str, value: object, reason: str
) -> None:
    db = tmp_path / "db.sqlite"
    assert bench("import", str(PROFILE), "--db", str(db), data_dir=tmp_path).returncode == 0
    r = bench("import", str(_bundle_with(tmp_path, where, key, value)), "--db", str(db), data_dir=tmp_path)
    assert r.returncode == 2 and reason in r.one_error(), r.stderr
    for argv in (
        ["runs"],
        ["report", "1", "--html", str(tmp_path / "r.html")],
        ["export", "1", "--out", str(tmp_path / "e.csv")],
    ):
        done = bench(*argv, "--db", str(db), data_dir=tmp_path)
        assert done.returncode == 0 and "Traceback" not in done.stderr, (argv, done.stderr)


def test_a_damaged_row_is_listed_and_named_and_a_damaged_file_is_one_line(tmp_path: Path) -> None:
    import sqlite3

    db = tmp_path / "db.sqlite"
    for bundle in (PROFILE, ROOT / "examples" / "h200-latency-bs1.json"):  # two bundles: one import is one run
        assert bench("import", str(bundle), "--db", str(db), data_dir=tmp_path).returncode == 0
    con = sqlite3.connect(db)
    con.execute("UPDATE runs SET summary_json=? WHERE id=1", (json.dumps({"ttft_ms": "x"}),))
    con.commit()
    con.close()
    listed = bench("runs", "--db", str(db), data_dir=tmp_path)
    assert listed.returncode == 0 and "Traceback" not in listed.stderr, listed.stderr
    store = Store(db)
    runs = {r.id: r for r in store.list_runs()}
    assert sorted(runs) == [1, 2] and runs[2].summary is not None
    assert runs[1].summary is None and "damaged (summary_json unreadable)" in (runs[1].error or "")
    store.close()
    # a file whose pages are zeroed: one line, no traceback
    data = bytearray(db.read_bytes())
    data[4096 : 8192 * 2] = bytes(8192 * 2 - 4096)
    broken = tmp_path / "broken.sqlite"
    broken.write_bytes(bytes(data))
    for argv in (["runs"], ["export", "1", "--out", str(tmp_path / "x.csv")]):
        r = bench(*argv, "--db", str(broken), data_dir=tmp_path)
        assert r.returncode == 2 and "Traceback" not in r.stderr, r.stderr
        assert "damaged" in r.one_error() or "not a MoE Bench database" in r.one_error(), r.stderr


def test_a_device_or_an_oversize_bundle_is_refused_in_one_line(tmp_path: Path) -> None:
    for dev in ("/dev/null", "/dev/full"):
        r = bench("runs", "--db", dev, data_dir=tmp_path)
        assert r.returncode == 2 and "is not a regular file" in r.one_error(), r.stderr
        assert not Path(dev + "-journal").exists() and not Path(dev + "-wal").exists()
    big = tmp_path / "big.json"
    with big.open("wb") as fh:  # sparse: 600 MiB that take no disk
        fh.truncate(600 * 2**20)
    r = bench("import", str(big), "--db", str(tmp_path / "db.sqlite"), data_dir=tmp_path)
    assert r.returncode == 2 and "over the 512 MiB allowed" in r.one_error(), r.stderr
    assert r.peak_rss < 300 * 2**20


# --- a managed server is gone when the CLI returns ------------------------------------------


def processes_of(data: Path) -> dict[int, str]:
    """Every process whose environment says it belongs to the CLI run of the data folder ``data``
    (MOEBENCH_DATA_DIR, inherited by every process a run starts)."""
    import psutil

    found = {}
    for p in psutil.process_iter(["cmdline", "status"]):
        with contextlib.suppress(psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
            if p.environ().get("MOEBENCH_DATA_DIR") == str(data):
                found[p.pid] = f"{p.pid} {p.info['status']} {' '.join(p.info['cmdline'] or [])[:80]}"
    return found


@pytest.mark.slow
def test_a_managed_triton_server_is_gone_when_the_cli_returns(tmp_path: Path, tiny_model: Path) -> None:
    """Checked at once after the CLI returns (no grace period): no tritonserver process (zombies
    included) and no model repository or temporary folder of the run is left; only its log."""
    import psutil

    def tritons() -> list[str]:
        found = []
        for p in psutil.process_iter(["name", "cmdline", "status"]):
            with contextlib.suppress(psutil.NoSuchProcess, psutil.AccessDenied):
                if "tritonserver" in " ".join(p.info["cmdline"] or []) or p.info["name"] == "tritonserver":
                    found.append(f"{p.pid} {p.info['status']}")
        return found

    before = tritons()
    tmp_before = set(Path("/tmp").glob("mb-tritonserver-*"))
    data = tmp_path / "data"
    data.mkdir()
    (data / "models").symlink_to(tiny_model.parent)
    r = bench("run", "--engine", "triton", "--model", "tiny-deepseek-v3", "--requests", "2", "--quiet",
              "--db", str(data / "db.sqlite"), data_dir=data)  # fmt: skip
    left = [t for t in tritons() if t not in before]
    assert r.returncode == 0, r.stderr
    assert left == [], left
    assert set(Path("/tmp").glob("mb-tritonserver-*")) == tmp_before
    assert not (data / "triton").exists() or not any((data / "triton").iterdir())
    assert list((data / "logs").glob("tritonserver-*.log"))  # the server's log is kept


# --- telemetry cannot grow without bound ----------------------------------------------------


def test_a_metrics_page_cannot_make_a_million_series_or_store_nan() -> None:
    from engines.prometheus import MAX_LABEL_VALUES, parse_prometheus, parse_prometheus_by
    from engines.telemetry import MAX_DEVICES, parse_exporter_text

    page = "\n".join(f'vllm:num_requests_running{{engine="{i}"}} 1' for i in range(5000))
    page += '\nvllm:kv_cache_usage_perc{engine="0"} NaN\nvllm:kv_cache_usage_perc{engine="1"} +Inf\n'
    by = parse_prometheus_by(page, "engine", ["vllm:num_requests_running", "vllm:kv_cache_usage_perc"])
    assert len({k[1] for k in by}) == MAX_LABEL_VALUES == 64
    assert not any(k[0] == "vllm:kv_cache_usage_perc" for k in by)
    sums = parse_prometheus(page)
    assert sums["vllm:num_requests_running"] == 5000 and "vllm:kv_cache_usage_perc" not in sums
    dcgm = "\n".join(f'DCGM_FI_DEV_GPU_UTIL{{gpu="{i}",modelName="H100"}} 50' for i in range(3000))
    assert len(parse_exporter_text(dcgm)) == MAX_DEVICES


def test_an_exporter_page_over_the_cap_is_not_read(tmp_path: Path) -> None:
    """A 20 MB exporter page: the source says why in one line and reads no device; the client's
    memory does not hold the page."""
    import http.server
    import threading

    from engines.telemetry import ExporterSource

    body = ('DCGM_FI_DEV_GPU_UTIL{gpu="0"} 5\n' * 700_000).encode()

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            self.send_response(200)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            with contextlib.suppress(OSError):
                self.wfile.write(body)

        def log_message(self, *args: object) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        source = ExporterSource(f"http://127.0.0.1:{server.server_address[1]}/metrics")
        assert source.read() == []
        assert "over 4 MiB: not read" in source.last_error, source.last_error
        source.close()
    finally:
        server.shutdown()


# --- every phase has a deadline ---------------------------------------------------------------


class DripServer:
    """Answers every connection with a status line sent one byte every 0.2 s, never finishing
    the headers (a server that httpx's per-read timeouts never catch)."""

    def __init__(self) -> None:
        import socket
        import threading

        self.sock = socket.create_server(("127.0.0.1", 0))
        self.port = self.sock.getsockname()[1]
        self.stop = threading.Event()
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self) -> None:
        import threading

        self.sock.settimeout(0.2)
        while not self.stop.is_set():
            try:
                conn, _ = self.sock.accept()
            except OSError:
                continue
            threading.Thread(target=self._drip, args=(conn,), daemon=True).start()

    def _drip(self, conn: object) -> None:
        import time

        with contextlib.suppress(OSError):
            conn.recv(65536)  # type: ignore[attr-defined]
            for byte in b"HTTP/1.1 200 OK\r\nX-Slow: " + b"a" * 10_000:
                if self.stop.is_set():
                    break
                conn.sendall(bytes([byte]))  # type: ignore[attr-defined]
                time.sleep(0.2)
        conn.close()  # type: ignore[attr-defined]

    def close(self) -> None:
        self.stop.set()
        self.sock.close()


def test_headers_sent_a_byte_at_a_time_end_at_the_deadline() -> None:
    """The threaded client (httpx, which Triton always uses): a whole exchange ends at its
    total deadline however slowly the headers come (the hang guard is the pytest timeout)."""
    import time

    import httpcore
    import httpx

    from engines.http_errors import http_get, httpx_client, total_deadline

    drip = DripServer()
    try:
        client = httpx_client(timeout=5.0)
        t0 = time.monotonic()
        with pytest.raises((httpx.TimeoutException, httpcore.TimeoutException)):
            http_get(client, f"http://127.0.0.1:{drip.port}/v1/models", timeout=1.5)
        assert time.monotonic() - t0 < 4.5  # 1.5 s asked; far under the 2,000 s the drip would take
        with total_deadline(1.0), pytest.raises(httpx.TimeoutException):
            client.get(f"http://127.0.0.1:{drip.port}/")
    finally:
        drip.close()


@pytest.mark.parametrize("client", list(CLIENTS))
def test_a_server_that_drips_its_headers_fails_the_run_in_one_line(tmp_path: Path, client: str) -> None:
    drip = DripServer()
    try:
        r, _ = openai_run(
            f"http://127.0.0.1:{drip.port}/v1", tmp_path, ["good one"], *CLIENTS[client],
            env={"MOEBENCH_REQUEST_TIMEOUT_S": "3"},
        )  # fmt: skip
    finally:
        drip.close()
    assert r.returncode != 0
    assert "Traceback" not in r.stderr
    line = r.one_error()
    assert f"127.0.0.1:{drip.port}" in line, line


def test_a_telemetry_exporter_that_drips_is_given_up(tmp_path: Path) -> None:
    from engines.telemetry import ExporterSource

    drip = DripServer()
    try:
        source = ExporterSource(f"http://127.0.0.1:{drip.port}/metrics", timeout=1.0)
        assert source.read() == [] and source.last_error, source.last_error
        source.close()
    finally:
        drip.close()


def test_a_ray_address_that_is_a_plain_http_server_is_refused_at_once(tmp_path: Path, server: HostileServer) -> None:
    """--ray-address of an HTTP server (here the hostile one): refused in one line before Ray
    retries for minutes (it did until killed at 300 s)."""
    r, _ = openai_run(server.url(), tmp_path, ["good one"], "--ray-address", f"127.0.0.1:{server.port}")
    assert r.returncode != 0
    line = r.one_error()
    assert "an HTTP server answers there, not a Ray head" in line, line


def test_names_with_terminal_escapes_are_printed_as_text(tmp_path: Path) -> None:
    """A run whose model is named with ANSI escapes (window title, colour, a C1 CSI): `bench runs`
    prints them as '?' (every CLI output goes through the same filter)."""
    db = tmp_path / "db.sqlite"
    bundle = json.loads(PROFILE.read_text())
    bundle["run"]["model"] = "\x1b]0;pwned\x07\x1b[31mred\x1b[0m\x9b2J"
    path = tmp_path / "esc.json"
    path.write_text(json.dumps(bundle))
    assert bench("import", str(path), "--db", str(db), data_dir=tmp_path).returncode == 0
    r = bench("runs", "--db", str(db), data_dir=tmp_path)
    assert r.returncode == 0
    assert "\x1b" not in r.stdout and "\x07" not in r.stdout and "\x9b" not in r.stdout
    assert "?]0;pwned??[31mred?[0m?2J"[:20] in r.stdout, r.stdout


def test_a_long_prompt_file_is_read_only_as_far_as_the_run_needs(tmp_path: Path, server: HostileServer) -> None:
    """A 300,000-line JSONL for a 4-request run: the first 4 prompts are read (a broken line far
    below them is never reached, and the file's other lines are not tokenized)."""
    path = tmp_path / "long.jsonl"
    with path.open("w") as fh:
        fh.write("".join(json.dumps({"prompt": f"good prompt {i}"}) + "\n" for i in range(300_000)))
        fh.write("{not json\n")
    r = bench("run", "--engine", "openai", "--base-url", server.url(), "--model", MODEL, "--prompts", "jsonl",
              "--prompt-file", str(path), "--requests", "4", "--warmup", "0", "--output-len", "4", "--quiet",
              "--db", str(tmp_path / "db.sqlite"), data_dir=tmp_path)  # fmt: skip
    assert r.returncode == 0, r.stderr
    assert r.peak_rss < 600 * 2**20


@pytest.mark.slow
def test_a_managed_vllm_server_is_gone_when_the_cli_returns(tmp_path: Path, tiny_model: Path) -> None:
    """The vLLM CPU server MoE Bench launches (API server, engine core, workers): none of its
    processes is alive, zombies included, at once after the CLI returns."""
    data = tmp_path / "data"
    data.mkdir()
    (data / "models").symlink_to(tiny_model.parent)
    before = processes_of(data)
    r = bench("run", "--engine", "vllm", "--model", "tiny-deepseek-v3", "--requests", "2", "--output-len", "4",
              "--quiet", "--db", str(data / "db.sqlite"), data_dir=data)  # fmt: skip
    left = [what for pid, what in processes_of(data).items() if pid not in before]
    assert r.returncode == 0, r.stderr[-2000:]
    assert left == [], left


def test_a_sparse_sharegpt_file_is_refused_before_it_is_read(
    tmp_path: Path, server: HostileServer, tiny_model: Path
) -> None:
    """900 MiB of zero bytes (sparse, under the 1 GiB cap) are refused from their first bytes: the
    CLI peaks no higher than on a 2-byte file that is refused too (a read would add ~900 MiB;
    the margin is for the machine's noise, the baseline is measured here because the CLI's own
    footprint with torch and a tokenizer is ~400 MiB and moves between machines)."""
    path, small = tmp_path / "sparse.json", tmp_path / "small.json"
    with path.open("wb") as fh:
        fh.truncate(900 * 2**20)
    small.write_text("{}")

    def refused(file: Path, reason: str) -> int:
        r = bench("run", "--engine", "openai", "--base-url", server.url(), "--model", MODEL, "--prompts", "sharegpt",
                  "--prompt-file", str(file), "--requests", "2", "--quiet", "--db", str(tmp_path / "db.sqlite"),
                  "--engine-opt", f"tokenizer={tiny_model}", data_dir=tmp_path)  # fmt: skip
        assert r.returncode != 0 and reason in r.one_error(), r.stderr
        return r.peak_rss

    baseline, sparse = refused(small, "small.json"), refused(path, "is not a ShareGPT JSON list")
    assert sparse < baseline + 200 * 2**20, f"{sparse / 2**20:.0f} MiB against {baseline / 2**20:.0f} MiB"
