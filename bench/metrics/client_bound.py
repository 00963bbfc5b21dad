"""When each request is due: the load pattern of a run.

Two patterns, with the conventions of ``vllm bench serve`` (the strategies themselves are in
:mod:`bench.send.schedule`):

- **closed loop** (``request_rate`` None): ``concurrency`` slots, each sends its next
  request as soon as its previous one ends. A request is due the moment its slot frees.
- **open loop** (``request_rate`` R req/s): arrivals follow a gamma process with shape
  ``burstiness`` and mean interval 1/R (burstiness 1 is a Poisson process; below 1
  burstier, above 1 more regular). ``concurrency`` caps the requests in flight, as
  ``--max-concurrency`` does; a request that finds every slot busy waits, and that
  wait counts as send lag.

Send lag is the actual send time minus the due time, per request. A closed loop's lag
is the client's own overhead between one request ending and the next starting; an
open loop's lag is the client (or the concurrency cap) falling behind the schedule.
Either way it is time the server never saw: a large lag means the client, not the
server, set the pace.
"""

from __future__ import annotations

# A run is called client-bound when the p90 send lag exceeds this many ms ...
CLIENT_BOUND_MIN_MS = 10.0
# ... and, for open loops, also this fraction of the mean interval between arrivals.
CLIENT_BOUND_INTERVAL_FRACTION = 0.25


def client_bound_reason(send_lag_p90_ms: float | None, request_rate: float | None) -> str | None:
    """One line saying the load was not delivered as planned, or None when the send lag stayed small."""
    if send_lag_p90_ms is None:
        return None
    limit = CLIENT_BOUND_MIN_MS
    if request_rate:
        limit = max(limit, CLIENT_BOUND_INTERVAL_FRACTION * 1000.0 / request_rate)
    if send_lag_p90_ms <= limit:
        return None
    if request_rate:
        return (
            f"load behind schedule: p90 send lag {send_lag_p90_ms:.1f} ms > {limit:.1f} ms, so fewer than "
            f"{request_rate:g} req/s reached the server (the concurrency cap or the client was the limit)"
        )
    return (
        f"client-bound: p90 send lag {send_lag_p90_ms:.1f} ms > {limit:.1f} ms between a request ending "
        "and the next one starting; the figures describe the client as much as the server"
    )
