"""The real CLI against a hostile OpenAI-compatible server (:mod:`tests.hostile.hostile_server`).

Each run mixes good requests with a hostile one (the prompt ``hostile:<mode>`` picks it),
sent one at a time in file order, and checks what a user and the store see: the one-line
reason, the exit code, the stored status, that the good requests' samples survive, and
that the client stopped reading (the server's byte count, the CLI's peak memory). Both
HTTP clients are covered: aiohttp (the default, ``async_client``) and httpx (threaded).
No assertion is on elapsed time; subprocess timeouts are hang guards only.
"""

from __future__ import annotations

import csv
import io
from pathlib import Path

import pytest

from bench.store import Store
from tests.hostile.clirun import CLIResult, bench, write_jsonl
from tests.hostile.hostile_server import (
    EMPTY_LINES_EVENT_BYTES,
    ENDLESS_BYTES,
    FORMULA,
    HUGE_EVENT_BYTES,
    HUGE_PIECE_BYTES,
    MODEL,
    HostileServer,
)

OUT = 8  # --output-len of every run here: the output cap is max(2 x 8, 8 + 64) = 72 tokens
MAX_RSS = 1.5e9  # bytes: the CLI (with any children) never gets near this reading a hostile stream
CLIENTS = {"async": [], "threaded": ["--engine-opt", "async_client=false"]}
HUGE = "an SSE {} over 4 MiB: stopped reading (a completion event is a few hundred bytes)"


def mixed_prompts(mode: str) -> list[str]:
    """Two good prompts, the hostile one (request r2), a good one."""
    return ["good one two three", "good four five", f"hostile:{mode} six", "good seven"]


def openai_run(
    url: str, tmp_path: Path, prompts: list[str], *extra: str, env: dict[str, str] | None = None
) -> tuple[CLIResult, Path]:
    """``bench run`` on the openai engine at ``url`` with ``prompts`` as a JSONL file, concurrency 1."""
    db = tmp_path / "db.sqlite"
    prompt_file = write_jsonl(tmp_path / "prompts.jsonl", prompts)
    result = bench(
        "run", "--engine", "openai", "--base-url", url, "--model", MODEL, "--prompts", "jsonl",
        "--prompt-file", str(prompt_file), "--requests", str(len(prompts)), "--concurrency", "1",
        "--warmup", "0", "--output-len", str(OUT), "--quiet", "--db", str(db), *extra,
        data_dir=tmp_path, env=env,
    )  # fmt: skip
    return result, db


def assert_only_r2_failed(db: Path, reason: str | None = None) -> str:
    """The run is stored completed with 3 good samples and r2 failed (with ``reason``); r2's error."""
    store = Store(db)
    (listed,) = store.list_runs()
    run = store.get_run(listed.id)
    assert run is not None and run.status == "completed", (run and run.status, run and run.error)
    assert run.summary is not None and run.summary.completed == 3 and run.summary.failed == 1
    records = {r.request_id: r for r in store.records(run.id)}
    assert sorted(records) == ["r0", "r1", "r2", "r3"] and store.sample_count(run.id) == 4
    for rid in ("r0", "r1", "r3"):
        assert records[rid].error is None and records[rid].output_tokens == OUT, records[rid]
    error = records["r2"].error
    assert error is not None and "\n" not in error
    if reason is not None:
        assert error == reason
    return error


CASES = [
    ("huge_event", {}, lambda url: f"SSEError: {HUGE.format('event')}"),
    ("huge_event_empty_lines", {}, lambda url: f"SSEError: {HUGE.format('event')}"),
    ("huge_line_no_newline", {}, lambda url: f"SSEError: {HUGE.format('line')}"),
    (
        "endless",
        {},
        lambda url: f"RequestFailed: the server sent more than 72 output tokens for max_tokens={OUT}: stopped reading",
    ),
    (
        "trickle",
        {"MOEBENCH_REQUEST_TIMEOUT_S": "3"},
        lambda url: "RequestFailed: request exceeded its 3 s deadline (MOEBENCH_REQUEST_TIMEOUT_S)",
    ),
    (
        "slow_first_byte",
        {"MOEBENCH_FIRST_BYTE_TIMEOUT_S": "2"},
        lambda url: f"RequestFailed: no response from {url}/completions within 2 s (MOEBENCH_FIRST_BYTE_TIMEOUT_S)",
    ),
    ("error_formula", {}, lambda url: f"RequestFailed: HTTP 500 from {url}/completions: {FORMULA}"),
]


@pytest.mark.parametrize("client", list(CLIENTS))
@pytest.mark.parametrize(("mode", "env", "reason"), CASES, ids=[c[0] for c in CASES])
def test_a_hostile_request_fails_alone_with_its_reason_and_the_good_ones_survive(
    tmp_path: Path, server: HostileServer, mode: str, env: dict[str, str], reason: object, client: str
) -> None:
    url = server.url()
    expected = reason(url)  # type: ignore[operator]
    r, db = openai_run(url, tmp_path, mixed_prompts(mode), *CLIENTS[client], env=env)
    assert r.returncode == 1, r.stderr
    assert r.one_error() == f"error: run 1: 1 of 4 requests failed (first: {expected}); --allow-failures accepts that"
    assert "run id        1  (completed, 1 of 4 requests failed)" in r.stdout
    assert_only_r2_failed(db, expected)
    assert server.hits == {"good": 3, mode: 1}
    assert r.peak_rss < MAX_RSS, f"the CLI peaked at {r.peak_rss / 2**20:.0f} MiB"
    size = {"huge_event_empty_lines": EMPTY_LINES_EVENT_BYTES, "endless": ENDLESS_BYTES}.get(mode, HUGE_EVENT_BYTES)
    if mode.startswith("huge") or mode == "endless":
        # The client hung up at its limit (4 MiB, or 72 tokens): the server never got to write
        # most of what it had (what it wrote includes the sockets' buffers, a few MB).
        assert server.bytes_sent[mode] < size / 2, f"the client read {server.bytes_sent[mode]:,} of {size:,} bytes"


@pytest.mark.parametrize("client", list(CLIENTS))
def test_a_redirect_to_another_server_is_not_followed(tmp_path: Path, client: str) -> None:
    """A 307 to another host/port fails the request with a reason naming the redirect; the
    other server gets no request (and so no prompt and no API key), and no sample of it is
    counted as a measurement of the server the user named."""
    with HostileServer(directives=False) as target, HostileServer(redirect_to=target.root) as server:
        env = {"MOEBENCH_OPENAI_API_KEY": "sk-hostile-redirect"}
        r, db = openai_run(server.url(), tmp_path, mixed_prompts("redirect"), *CLIENTS[client], env=env)
        error = assert_only_r2_failed(db)
        assert "307" in error and "redirect" in error.lower(), error
        assert r.returncode == 1, r.stderr
        assert r.one_error() == f"error: run 1: 1 of 4 requests failed (first: {error}); --allow-failures accepts that"
        assert sum(target.hits.values()) == 0 and target.auth_headers == [], (target.paths, target.auth_headers)
        assert server.hits == {"good": 3, "redirect": 1}


@pytest.mark.parametrize("endpoint", ["completions", "chat"])
def test_a_run_whose_every_request_is_hostile_is_failed_and_keeps_its_samples(
    tmp_path: Path, server: HostileServer, endpoint: str
) -> None:
    """The mode from the URL (``/endless/v1``), on both endpoints: every request fails, so the run does."""
    url = server.url("endless")
    db = tmp_path / "db.sqlite"
    r = bench(
        "run", "--engine", "openai", "--base-url", url, "--model", MODEL, "--engine-opt", f"endpoint={endpoint}",
        "--prompts", "builtin", "--requests", "3", "--concurrency", "1", "--warmup", "0", "--output-len", str(OUT),
        "--quiet", "--db", str(db), data_dir=tmp_path,
    )  # fmt: skip
    reason = f"RequestFailed: the server sent more than 72 output tokens for max_tokens={OUT}: stopped reading"
    assert r.returncode == 1, r.stderr
    assert r.one_error() == f"error: run 1 failed: every request failed; first error: {reason}"
    assert "run id        1  (failed, 3 of 3 requests failed)" in r.stdout
    store = Store(db)
    (run,) = store.list_runs()
    assert run.status == "failed" and run.error == f"every request failed; first error: {reason}"
    assert store.sample_count(run.id) == 3 and all(rec.error == reason for rec in store.records(run.id))
    assert server.hits == {"endless": 3}


@pytest.mark.slow
def test_hostile_streams_through_sender_processes(tmp_path: Path, server: HostileServer) -> None:
    """With --workers 2 the requests are sent from two sender processes; each hostile stream
    still fails alone with its reason, memory (parent and senders) stays bounded."""
    prompts = ["good a", "hostile:huge_event b", "good c", "hostile:endless d", "good e", "good f"]
    r, db = openai_run(server.url(), tmp_path, prompts, "--workers", "2", "--concurrency", "2")
    huge = f"SSEError: {HUGE.format('event')}"
    endless = f"RequestFailed: the server sent more than 72 output tokens for max_tokens={OUT}: stopped reading"
    assert r.returncode == 1, r.stderr
    line = r.one_error()
    assert line.startswith("error: run 1: 2 of 6 requests failed (first: ") and (huge in line or endless in line)
    store = Store(db)
    (run,) = store.list_runs()
    assert run.status == "completed" and run.summary is not None and run.summary.failed == 2
    records = {rec.request_id: rec for rec in store.records(run.id)}
    assert records["r1"].error == huge and records["r3"].error == endless
    assert all(records[rid].error is None and records[rid].output_tokens == OUT for rid in ("r0", "r2", "r4", "r5"))
    assert r.peak_rss < MAX_RSS, f"the CLI and its senders peaked at {r.peak_rss / 2**20:.0f} MiB"
    assert server.bytes_sent["huge_event"] < HUGE_EVENT_BYTES / 4


@pytest.mark.slow
def test_credentials_in_the_base_url_never_reach_output_the_store_or_the_server(
    tmp_path: Path, server: HostileServer
) -> None:
    """A store that already holds a run (made with an API key from the environment); then the
    same server with ``user:sk-secret@`` in its URL, three ways. Each is refused (exit 2), the
    secret is in no output, the store's files or an export, and the server hears nothing."""
    env = {"MOEBENCH_OPENAI_API_KEY": "sk-env-secret-7f3a"}
    first, db = openai_run(server.url(), tmp_path, ["good one", "good two"], env=env)
    assert first.returncode == 0, first.stderr
    heard = len(server.paths)
    secret_url = f"http://user:sk-secret@127.0.0.1:{server.port}/v1"
    shown = f"http://***@127.0.0.1:{server.port}/v1"
    common = ["--model", MODEL, "--prompts", "builtin", "--requests", "1", "--quiet", "--db", str(db)]
    attempts = [
        ["run", "--engine", "openai", "--base-url", secret_url, *common],
        ["run", "--engine", "openai", "--engine-opt", f"base_url={secret_url}", *common],
        ["sweep", "--engine", "openai", "--base-url", secret_url, "--concurrency", "1,2", *common],
    ]
    outputs = [first.stdout + first.stderr]
    for argv in attempts:
        r = bench(*argv, data_dir=tmp_path, env=env)
        assert r.returncode == 2, (argv, r.stderr)
        line = r.one_error()
        assert f"base_url carries credentials ({shown})" in line and "MOEBENCH_OPENAI_API_KEY" in line, line
        outputs.append(r.stdout + r.stderr)
    bundle = tmp_path / "bundle.json"
    exported = bench("export", "1", "--bundle", "--csv", str(bundle), "--db", str(db), data_dir=tmp_path)
    assert exported.returncode == 0, exported.stderr
    assert len(server.paths) == heard, server.paths[heard:]  # nothing was sent with the credentials
    store = Store(db)
    assert [run.status for run in store.list_runs()] == ["completed"]  # nothing recorded for them
    store.close()
    files = [p for p in tmp_path.iterdir() if p.name.startswith("db.sqlite")] + [bundle]
    for secret in ("sk-secret", "sk-env-secret-7f3a"):
        assert not any(secret in text for text in outputs), secret
        for f in files:
            assert secret.encode() not in f.read_bytes(), (secret, f.name)


def _cells(data: bytes) -> list[str]:
    return [cell for row in csv.reader(io.StringIO(data.decode("utf-8"))) for cell in row]


def _is_number(text: str) -> bool:
    try:
        float(text)
    except ValueError:
        return False
    return True


@pytest.mark.slow
def test_formula_text_from_the_user_and_the_server_is_inert_in_every_csv(tmp_path: Path, server: HostileServer) -> None:
    """A run named ``=HYPERLINK("x")``, a model named like a formula, a server whose error is a
    formula: with --allow-failures the run exits 0; in the CSVs of `run` and `export` no text
    cell can start a formula, and the server's text is kept whole inside its cell."""
    name, model = '=HYPERLINK("x")', "@SUM(1+1)"
    req_csv, sum_csv = tmp_path / "req.csv", tmp_path / "sum.csv"
    url = server.url()
    db = tmp_path / "db.sqlite"
    prompt_file = write_jsonl(tmp_path / "prompts.jsonl", ["good one", "hostile:error_formula two"])
    r = bench(
        "run", "--engine", "openai", "--base-url", url, "--model", model, "--engine-opt", "check_model=false",
        "--prompts", "jsonl", "--prompt-file", str(prompt_file), "--requests", "2", "--concurrency", "1",
        "--warmup", "0", "--output-len", str(OUT), "--quiet", "--name", name, "--allow-failures",
        "--csv", str(req_csv), "--summary-csv", str(sum_csv), "--db", str(db), data_dir=tmp_path,
    )  # fmt: skip
    assert r.returncode == 0, r.stderr
    assert r.error_lines == [] and "Traceback" not in r.stderr
    assert "run id        1  (completed, 1 of 2 requests failed)" in r.stdout
    (run,) = Store(db).list_runs()
    assert run.status == "completed" and run.name == name and run.model == model  # stored as given
    exp_req, exp_sum = tmp_path / "export-req.csv", tmp_path / "export-sum.csv"
    for argv, out in ((["--csv", str(exp_req)], exp_req), (["--summary", "--csv", str(exp_sum)], exp_sum)):
        e = bench("export", "1", *argv, "--db", str(db), data_dir=tmp_path)
        assert e.returncode == 0 and out.exists(), e.stderr
    assert exp_req.read_bytes() == req_csv.read_bytes() and exp_sum.read_bytes() == sum_csv.read_bytes()
    (summary,) = csv.DictReader(io.StringIO(sum_csv.read_text()))
    assert summary["name"] == "'" + name and summary["model"] == "'" + model
    rows = {row["request_id"]: row for row in csv.DictReader(io.StringIO(req_csv.read_text()))}
    assert rows["r1"]["error"] == f"RequestFailed: HTTP 500 from {url}/completions: {FORMULA}"
    for path in (req_csv, sum_csv):
        for cell in _cells(path.read_bytes()):
            assert not cell.startswith(("=", "+", "@", "\t", "\r")), (path.name, cell)
            assert not cell.startswith("-") or _is_number(cell), (path.name, cell)


def test_a_100_mb_routed_experts_event_is_skipped_and_the_requests_kept(
    tmp_path: Path, server: HostileServer, tiny_model: Path
) -> None:
    """routed_experts on (SGLang's response-level event): an event of 100 MB of base64 after the
    completion is read past, not kept (the client's peak memory stays bounded); every request keeps
    its tokens and figures; the run records why it has no routing, in one line, and exits 0. (The
    threaded client's decoder is the same SSEDecoder with the same limits: tests/engines/test_served_routing.py.)"""
    prompts = ["hostile:huge_routing one", "hostile:huge_routing two"]
    extra = ["--engine-opt", "routed_experts=true", "--engine-opt", f"tokenizer={tiny_model}"]
    r, db = openai_run(server.url(), tmp_path, prompts, *extra)
    assert r.returncode == 0, r.stderr
    store = Store(db)
    (run,) = store.list_runs()
    assert run.status == "completed" and run.summary is not None and run.summary.failed == 0
    assert all(rec.error is None and rec.output_tokens == OUT for rec in store.records(run.id))
    why = store.artifact(run.id, "expert_routing_error")["error"]
    assert why == (
        "request r0: routing an SSE event over the size cap after the completion (its routed_experts): left out; "
        "its routing is left out"
    ), why
    assert store.artifact(run.id, "expert_routing") is None
    assert r.peak_rss < MAX_RSS, f"the CLI peaked at {r.peak_rss / 2**20:.0f} MiB"
    # Read past, not hung up on: the server wrote both events whole (the usage and [DONE] after them arrived).
    assert server.bytes_sent["huge_routing"] > 2 * (HUGE_EVENT_BYTES // HUGE_PIECE_BYTES) * HUGE_PIECE_BYTES
