"""The third hostile round, engine side (issue 45, section 2): counts and payloads a server
controls, checked against the request that asked for them, and the routing and
expert-parallel what-ifs bounded. Each test fails without its fix."""

from __future__ import annotations

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
