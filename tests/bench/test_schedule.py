"""Arrival strategies on a fake clock: exact, no model, no real time."""

from __future__ import annotations

import itertools

import pytest

from bench.send.core import split_slots
from bench.send.schedule import ClosedLoop, LocalTickets, OpenLoop, Sequential, arrival_offsets, simulate, strategy_for
from tests.fakes import peak_overlap


def _max_in_flight(plan: list) -> int:
    return peak_overlap([(p.sent, p.end) for p in plan])


def test_sequential_sends_each_request_when_the_last_one_ends() -> None:
    plan = simulate(Sequential(), [1.0, 2.0, 0.5, 3.0])
    expected = [(0.0, 0.0, 1.0), (1.0, 1.0, 3.0), (3.0, 3.0, 3.5), (3.5, 3.5, 6.5)]
    assert [(p.due, p.sent, p.end) for p in plan] == expected
    assert all(p.lag == 0 for p in plan)


def test_closed_loop_keeps_every_slot_busy_and_never_more() -> None:
    service = [3.0, 1.0, 1.0, 1.0, 2.0, 1.0]
    plan = simulate(ClosedLoop(2), service)
    # t=0: r0 (slot 0) and r1 (slot 1); r1 ends at 1 -> r2; r2 ends at 2 -> r3; r0 and r3 end at 3 -> r4, r5
    expected = [(0, 0, 0.0), (1, 1, 0.0), (2, 1, 1.0), (3, 1, 2.0), (4, 0, 3.0), (5, 1, 3.0)]
    assert [(p.seq, p.slot, p.sent) for p in plan] == expected
    assert _max_in_flight(plan) == 2
    assert all(p.due == p.sent for p in plan)  # due the moment a slot frees: no lag on a fake clock


def test_open_loop_follows_the_arrivals_until_the_cap_makes_requests_wait() -> None:
    strategy = OpenLoop(offsets=(0.0, 0.5, 1.0, 1.5, 2.0), rate=2.0, concurrency=2)
    plan = simulate(strategy, [0.2, 2.0, 2.0, 0.1, 0.1])
    sent = {p.seq: p.sent for p in plan}
    assert sent[0] == 0.0 and sent[1] == 0.5 and sent[2] == 1.0
    # r1 and r2 hold both slots until 2.5 and 3.0: r3 (due 1.5) waits for the first to free
    assert sent[3] == 2.5 and plan[3].lag == pytest.approx(1.0)
    assert sent[4] == 2.6 and plan[4].lag == pytest.approx(0.6)
    assert _max_in_flight(plan) == 2


def test_open_loop_below_saturation_has_no_lag() -> None:
    strategy = OpenLoop.make(500, rate=10.0, burstiness=1.0, concurrency=64, seed=1)
    plan = simulate(strategy, [0.05] * 500)
    assert all(p.lag == 0 and p.sent == strategy.offsets[p.seq] for p in plan)


def test_arrivals_have_the_asked_rate_and_are_reproducible() -> None:
    offs = arrival_offsets(4000, request_rate=20.0, burstiness=1.0, seed=7)
    assert offs[0] == 0.0 and all(b >= a for a, b in itertools.pairwise(offs))
    assert 4000 / offs[-1] == pytest.approx(20.0, rel=0.05)
    assert arrival_offsets(4000, 20.0, 1.0, seed=7) == offs


def test_strategy_for_each_mode() -> None:
    assert isinstance(strategy_for("latency", 5, 8, None, 1.0, 0), Sequential)
    closed = strategy_for("concurrency", 5, 8, None, 1.0, 0)
    assert isinstance(closed, ClosedLoop) and closed.slots == 8 and not closed.open_loop
    opened = strategy_for("concurrency", 5, 8, 3.0, 0.5, 2)
    assert isinstance(opened, OpenLoop) and opened.slots == 8 and len(opened.offsets) == 5
    assert list(opened.offsets) == arrival_offsets(5, 3.0, 0.5, seed=2)
    with pytest.raises(ValueError):
        ClosedLoop(0)


def test_tickets_are_handed_out_once_in_order() -> None:
    t = LocalTickets(3)
    assert [t.take(), t.take(), t.take(), t.take()] == [0, 1, 2, None]


def test_slots_are_dealt_over_workers() -> None:
    assert split_slots(5, 2) == [[0, 2, 4], [1, 3]]
    assert sorted(itertools.chain(*split_slots(256, 3))) == list(range(256))


def test_closed_loop_ramp_opens_slots_one_by_one() -> None:
    from bench.send.schedule import ClosedLoop, simulate

    plan = simulate(ClosedLoop(4, ramp_s=2.0), [10.0] * 4)
    assert sorted(p.sent for p in plan) == pytest.approx([0.0, 0.5, 1.0, 1.5])


def test_open_loop_ramp_climbs_linearly_then_holds() -> None:
    from bench.send.schedule import OpenLoop, ramped

    assert ramped(0.0, 10) == 0.0 and ramped(5.0, 10) == pytest.approx(10.0) and ramped(8.0, 10) == 13.0
    flat = OpenLoop.make(4000, 100.0, 1.0, 1000, seed=1)
    ramp = OpenLoop.make(4000, 100.0, 1.0, 1000, seed=1, ramp_s=10.0)
    in_ramp = sum(1 for t in ramp.offsets if t < 10.0)
    assert 450 < in_ramp < 550  # half the arrivals of a flat 10 s (100 req/s * 10 s / 2)
    first_half = sum(1 for t in ramp.offsets if t < 5.0)
    assert 0.2 * in_ramp < first_half < 0.3 * in_ramp  # the rate climbs: a quarter in the first half
    after = [t for t in ramp.offsets if t >= 10.0]
    rate = (len(after) - 1) / (after[-1] - after[0])
    assert rate == pytest.approx(100.0, rel=0.1)  # then holds at the target
    assert len(flat.offsets) == len(ramp.offsets) == 4000


def test_duration_bound_schedules_send_nothing_after_the_end() -> None:
    from bench.send.schedule import ClosedLoop, OpenLoop, simulate, strategy_for

    plan = simulate(ClosedLoop(2, duration_s=1.0), [0.3] * 100)
    assert len(plan) == 8  # each slot sends at 0, 0.3, 0.6, 0.9; the next would start at 1.2
    assert max(p.sent for p in plan) <= 1.0 and max(p.end for p in plan) == pytest.approx(1.2)
    ol = OpenLoop.make(1000, 50.0, 1.0, 10, seed=3, duration_s=2.0)
    assert ol.max_requests == len(ol.offsets) and max(ol.offsets) <= 2.0 and 70 < len(ol.offsets) < 130
    assert len(simulate(ol, [0.01] * 1000)) == len(ol.offsets)
    assert strategy_for("latency", 10, 1, None, 1.0, 0, duration_s=5.0).deadline == 5.0
