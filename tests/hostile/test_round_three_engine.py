"""The third hostile round, engine side (issue 45, section 2): counts and payloads a server
controls, checked against the request that asked for them, and the routing and
expert-parallel what-ifs bounded. Each test fails without its fix."""

from __future__ import annotations

import contextlib
import re
from pathlib import Path

import pytest

from bench.store import Store
from tests.hostile.hostile_server import HostileServer
from tests.hostile.test_hostile_server import CLIENTS, OUT, assert_only_r2_failed, mixed_prompts, openai_run

# --- a server's usage count is checked against the request's own cap -----------------------

USAGE_CASES = [
    ("usage_over_cap", f"the server's usage says 999999999 output tokens for max_tokens={OUT}: not believed"),
    ("usage_under_streamed", f"the server's usage says 1 output tokens after streaming at least {OUT}: not believed"),
]


@pytest.mark.parametrize("client", list(CLIENTS))
@pytest.mark.parametrize(("mode", "reason"), USAGE_CASES, ids=[c[0] for c in USAGE_CASES])
def test_a_usage_count_past_the_requests_cap_fails_that_request_and_never_reaches_throughput(
    tmp_path: Path, server: HostileServer, mode: str, reason: str, client: str
) -> None:
    """``completion_tokens`` 999,999,999 on a request of max_tokens 8 (or 1 after 8 streamed): that
    request fails with the reason in one line, the others keep their figures, and the run's output
    throughput counts only their tokens (it was 71,573,955,970 tok/s)."""
    r, db = openai_run(server.url(), tmp_path, mixed_prompts(mode), *CLIENTS[client])
    assert r.returncode == 1, r.stderr
    assert "Traceback" not in r.stderr
    assert assert_only_r2_failed(db) == f"RequestFailed: {reason}"
    (run,) = Store(db).list_runs()
    assert run.summary is not None and run.summary.output_tokens == 3 * OUT
    assert run.summary.output_throughput_tok_s < 1e6
    assert server.hits[mode] == 1


# --- only a string is reasoning text -------------------------------------------------------


def test_a_reasoning_content_that_is_not_a_string_counts_no_reasoning(tmp_path: Path, server: HostileServer) -> None:
    """``reasoning_content`` 5, ["think"] and {"text": "think"}: no reasoning token, no reasoning
    figure; the answer's tokens are counted as before."""
    r, db = openai_run(server.url(), tmp_path, mixed_prompts("reasoning_not_text"), "--engine-opt", "endpoint=chat")
    assert r.returncode == 0, r.stderr
    store = Store(db)
    (run,) = store.list_runs()
    records = {rec.request_id: rec for rec in store.records(run.id)}
    assert records["r2"].error is None and records["r2"].output_tokens == OUT
    assert records["r2"].reasoning_tokens == 0 and records["r2"].reasoning_chunks == 0
    assert run.summary is not None and run.summary.reasoning_tokens is None
    assert "reasoning" not in r.stdout
    assert server.hits["reasoning_not_text"] == 1


# --- speculative-decoding counters are checked before they become figures -------------------


def _spec_points(drafts: float, tokens: float, accepted: float, per_pos: tuple[float, ...] = ()) -> list[tuple]:
    """A run's series points: every counter at 0 before the first request and at the value after."""
    from engines.base import SERIES_SPEC_ACCEPTED, SERIES_SPEC_DRAFT_TOKENS, SERIES_SPEC_DRAFTS, SERIES_SPEC_POS

    names = {SERIES_SPEC_DRAFTS: drafts, SERIES_SPEC_DRAFT_TOKENS: tokens, SERIES_SPEC_ACCEPTED: accepted}
    names.update({f"{SERIES_SPEC_POS}{k}": v for k, v in enumerate(per_pos)})
    return [(0.0, n, 0.0) for n in names] + [(1.0, n, v) for n, v in names.items()]


SPEC_CASES = [
    ((1, 1, 100_000), "the server counts 100000 accepted of 1 draft tokens: more accepted than proposed"),
    (
        (100, 300, 250, (100, 899)),
        "the server counts 899 accepted at draft position 1 of 100 drafts: more than drafted",
    ),
    ((1e308, 1e308, 1e308), "the server's counter server_spec_drafts reads 1e+308, not a count (over 9.01e+15)"),
    ((10, 5, 5), "the server counts 5 draft tokens in 10 drafts: fewer than one a draft"),
]


@pytest.mark.parametrize(("counters", "reason"), SPEC_CASES, ids=["accepted", "per_pos", "1e308", "tokens"])
def test_absurd_speculative_counters_give_no_figure_and_one_reason(
    counters: tuple, reason: str, caplog: pytest.LogCaptureFixture
) -> None:
    """accepted growing 100,000 against 1 draft token (it printed acceptance 10000000.0%), 899
    accepted at a position of 100 drafts (899 %), 1e308 counters (300 digits, into the vllm-json
    export too): no spec figure at all, and the reason in one line."""
    from bench.metrics import spec_decode

    points = _spec_points(*counters)
    with caplog.at_level("WARNING", logger="bench.metrics.spec_decode"):
        assert spec_decode.spec_fields(points) == {}
    assert [r.getMessage() for r in caplog.records] == [f"speculative-decoding figures left out: {reason}"]
    assert spec_decode.spec_figures(points) == ({}, reason)


def test_believable_speculative_counters_still_give_their_figures() -> None:
    from bench.metrics.spec_decode import spec_figures

    fields, why = spec_figures(_spec_points(100, 300, 150, (80, 50, 20)))
    assert why is None and fields["spec_acceptance_rate"] == pytest.approx(0.5)
    assert fields["spec_accepted_per_pos"] == pytest.approx((0.8, 0.5, 0.2))


# --- routing payloads leave routing out, never the request or the run -----------------------

HEADER = "routed_experts' .npy header says shape (1099511627776, 2, 2) of int32; 32 bytes follow it"
ROWS = "routed_experts has 31,250 rows (tokens); the request has at most 74 (prompt + max_tokens + 64)"
TOP_K = "routed_experts has top-500 ids a token; the model routes to 2"
STREAMED_CASES = [("routing_huge_header", HEADER), ("routing_rows", ROWS), ("routing_top_k", TOP_K)]


def _routing_run(tmp_path: Path, server: HostileServer, tiny_model: Path, mode: str, *extra: str) -> tuple:
    """Two requests of ``mode``, routed experts asked for (streamed, or by ``extra``); the stored run."""
    prompts = [f"hostile:{mode} one", f"hostile:{mode} two"]
    r, db = openai_run(server.url(), tmp_path, prompts, "--engine-opt", f"tokenizer={tiny_model}", *extra)
    assert r.returncode == 0, r.stderr
    assert "Traceback" not in r.stderr
    store = Store(db)
    (run,) = store.list_runs()
    assert run.status == "completed" and run.summary is not None and run.summary.failed == 0
    assert all(rec.error is None and rec.output_tokens == OUT for rec in store.records(run.id))
    assert server.hits[mode] >= 2  # the directive chose the mode (a mode name has no digit)
    return store, run


@pytest.mark.parametrize(("mode", "reason"), STREAMED_CASES, ids=[c[0] for c in STREAMED_CASES])
def test_a_streamed_routing_payload_that_cannot_be_the_requests_is_left_out_with_its_reason(
    tmp_path: Path, server: HostileServer, tiny_model: Path, mode: str, reason: str
) -> None:
    """An .npy header declaring 2**40 rows over 32 bytes (a MemoryError), 1 MB of "AAAA" on a
    10-token request (counted as 31,250 tokens), top-500 ids on a top-2 model (accepted): every
    request completes, the run has no routing, and says why in one line."""
    store, run = _routing_run(tmp_path, server, tiny_model, mode, "--engine-opt", "routed_experts=true")
    why = store.artifact(run.id, "expert_routing_error")["error"]
    assert why.startswith(f"request r0: routing {reason}") and "\n" not in why, why
    assert store.artifact(run.id, "expert_routing") is None


def test_streamed_uint64_ids_in_range_are_counted(tmp_path: Path, server: HostileServer, tiny_model: Path) -> None:
    """An .npy of uint64 ids (each naming one of the model's 8 experts) failed its request with a
    TypeError; now they are counted as any integer ids: 2 requests x 9 rows x 2 layers x top-2."""
    store, run = _routing_run(tmp_path, server, tiny_model, "routing_unsigned", "--engine-opt", "routed_experts=true")
    routing = store.artifact(run.id, "expert_routing")
    assert routing is not None and store.artifact(run.id, "expert_routing_error") is None
    assert sum(map(sum, routing["counts"])) == 2 * 9 * 2 * 2


NOT_A_LIST = "the answer's choices is a {}, not a list"
PASS_CASES = [
    ("pass_choices_object", NOT_A_LIST.format("dict")),
    ("pass_choices_number", NOT_A_LIST.format("int")),
    ("pass_huge_header", HEADER),
    ("pass_nested", "the answer is not JSON (RecursionError: maximum recursion depth exceeded"),
]


@pytest.mark.parametrize(("mode", "reason"), PASS_CASES, ids=[c[0] for c in PASS_CASES])
def test_a_routing_pass_answer_that_cannot_be_read_leaves_routing_out_and_the_run_completed(
    tmp_path: Path, server: HostileServer, tiny_model: Path, mode: str, reason: str
) -> None:
    """routing_pass=2 after a completed window: an answer whose choices is {"x": 1} or 5, whose
    routed_experts' header declares 2**40 rows, or JSON nested 100,000 deep made the whole run
    failed; now the run completes with no routing and the first reason in one line."""
    store, run = _routing_run(tmp_path, server, tiny_model, mode, "--engine-opt", "routing_pass=2")
    why = store.artifact(run.id, "expert_routing_error")["error"]
    assert why.startswith(f"routing pass over 2 requests: none gave routing; request r0: {reason}"), why
    assert "\n" not in why and store.artifact(run.id, "expert_routing") is None
    assert server.hits[mode] == 4  # two streamed in the window, two not streamed in the pass


def test_a_routing_pass_of_uint64_ids_in_range_counts_them(
    tmp_path: Path, server: HostileServer, tiny_model: Path
) -> None:
    store, run = _routing_run(tmp_path, server, tiny_model, "pass_unsigned", "--engine-opt", "routing_pass=2")
    routing = store.artifact(run.id, "expert_routing")
    assert routing is not None and routing["pass_requests"] == 2 and "error" not in routing
    assert sum(map(sum, routing["counts"])) == 2 * 9 * 2 * 2


# --- the routing and all-to-all commands: bounded, one line each -----------------------------


@pytest.fixture(scope="module")
def routed_run(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, int]:
    """A store holding the H200 example run (26 MoE layers x 64 experts, top-6, native routing)."""
    from bench.bundle import import_bundle_file
    from tests.hostile.clirun import ROOT

    db = tmp_path_factory.mktemp("routed") / "db.sqlite"
    return db, import_bundle_file(Store(db), ROOT / "examples" / "h200-latency-bs1.json")


def test_the_routing_command_counts_routed_tokens_per_layer_as_the_dashboard_does(
    tmp_path: Path, routed_run: tuple[Path, int]
) -> None:
    """The tokens column is the record's tokens per layer (through the gate: what the Profiling
    page calls "tokens per layer"), not the selections (tokens x top-6, 6 times as many)."""
    from tests.hostile.clirun import bench

    db, run_id = routed_run
    routing = Store(db).artifact(run_id, "expert_routing")
    r = bench("routing", str(run_id), "--db", str(db), data_dir=tmp_path)
    assert r.returncode == 0, r.stderr
    rows = [line.split() for line in r.stdout.splitlines() if re.match(r"layer \d+ ", line)]
    assert len(rows) == 26
    assert [row[2] for row in rows] == [f"{t:,.0f}" for t in routing["tokens"]]
    assert sum(routing["counts"][0]) == 6 * routing["tokens"][0]  # selections: what it printed before
    assert "tokens: routed tokens per layer" in r.stdout


BOUND_CASES = [
    (["--redundant", "8000000"], "--redundant 8000000: the EPLB what-if takes 0 to 1024 replicas"),
    (["--nodes", "0"], "--nodes 0: the EP 8 ranks are on 1 to 8 nodes"),
    (["--nodes", "-1"], "--nodes -1: the EP 8 ranks are on 1 to 8 nodes"),
]


@pytest.mark.parametrize(("flags", "reason"), BOUND_CASES, ids=["redundant", "nodes0", "nodes-1"])
def test_the_routing_what_if_is_bounded_in_one_line(
    tmp_path: Path, routed_run: tuple[Path, int], flags: list[str], reason: str
) -> None:
    """--redundant 8000000 took 123 s and 1 GB; --nodes 0 and -1 were tracebacks."""
    from tests.hostile.clirun import bench

    db, run_id = routed_run
    r = bench("routing", str(run_id), *flags, "--db", str(db), data_dir=tmp_path)
    assert r.returncode == 2 and r.one_error() == f"error: {reason}"


@pytest.mark.parametrize(
    ("field", "value", "reason"),
    [
        ("n_group", "x", "routing record: n_group must be a whole number of groups, got 'x'"),
        ("layers", 5, "routing record: layers must be a list of 26 labels, got 5"),
    ],
)
def test_a_routing_record_with_a_bad_field_is_one_line(
    tmp_path: Path, routed_run: tuple[Path, int], field: str, value: object, reason: str
) -> None:
    """An imported run whose routing says ``n_group: "x"`` or ``layers: 5`` (no MoE figures in its
    summary to fall back on): ``routing N`` says so in one line, and the summary's figures stay empty."""
    from bench.metrics import moe
    from tests.hostile.clirun import bench

    db, run_id = routed_run
    store = Store(db)
    routing = {**store.artifact(run_id, "expert_routing"), field: value}
    bad = tmp_path / "db.sqlite"
    import sqlite3

    with contextlib.closing(sqlite3.connect(db)) as src, contextlib.closing(sqlite3.connect(bad)) as dst:
        src.backup(dst)  # the file's bytes alone miss what is still in its write-ahead log
    Store(bad).put_artifact(run_id, "expert_routing", routing)
    r = bench("routing", str(run_id), "--db", str(bad), data_dir=tmp_path)
    assert r.returncode == 2 and r.one_error() == f"error: {reason}"
    assert moe.run_figures(routing) == dict.fromkeys(moe.MOE_RUN_COLUMNS)


@pytest.mark.parametrize(
    ("flags", "reason"),
    [
        (["--max-mib", "0.001"], "--max-mib takes 0.00390625 to 4096 (the sweep's first message is 4 KiB)"),
        (["--ranks", "100000"], "--ranks 100000: an all-to-all here takes 2 to 64 ranks"),
    ],
    ids=["max-mib", "ranks"],
)
def test_the_all_to_all_sweep_is_bounded_in_one_line(
    flags: list[str], reason: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """--max-mib 0.001 measured nothing and printed torch's OMP banner as its reason; --ranks had
    no upper bound (100,000 processes). Checked in-process with the launcher replaced by a failure:
    code without the bound must not start 100,000 ranks on this machine (one did, in checking)."""
    import argparse

    from bench.cli import parallel
    from engines.errors import ConfigError

    def no_launch(*args: object, **kwargs: object) -> None:
        raise AssertionError("the sweep was launched")

    monkeypatch.setattr(parallel.subprocess, "run", no_launch)
    p = argparse.ArgumentParser()
    parallel.add_a2a_arguments(p)
    args = p.parse_args(flags)
    with pytest.raises(ConfigError) as err:
        parallel.run_sweep(args.ranks, args.accelerator, args.max_mib, args.iters)
    assert str(err.value).startswith(reason) and "\n" not in str(err.value)
