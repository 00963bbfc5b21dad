"""How long the dashboard takes to build its charts for runs of 1k, 10k and 100k requests.

Not a test: it prints a table. Run from the repository root as ``python -m studies.dashboard_render``;
no Streamlit here. For each size it writes a
synthetic run (RequestRecords with per-token chunk times, per-second series) through the
real :class:`bench.store.Store` into a temporary SQLite file, then times what a page does
on every redraw:

- live fragment: read the bounded window + series (``dashboard.data.load_live``), build the
  six live figures (``dashboard.data.live_figures``), serialize them to JSON (what
  ``st.plotly_chart`` sends to the browser);
- Results page: list the runs (``Store.list_runs`` + ``runs_frame``), build the comparison
  bars and the latency/throughput scatter, and the run-details charts of one run.

Usage: ``python -m studies.dashboard_render [--sizes 1000 10000 100000] [--repeat 3]``
"""

from __future__ import annotations

import argparse
import random
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from bench.metrics.summary import summarize
from bench.run.recorder import (
    SERIES_DONE,
    SERIES_IN_FLIGHT,
    SERIES_MEM_ALLOCATED,
    SERIES_MEM_PEAK,
    SERIES_MEM_RESERVED,
    SERIES_OUTPUT_TOK_S,
    Recorder,
)
from bench.send.core import Completion
from bench.store import Store
from dashboard import charts, data

RATE_SAMPLE = 100_000  # requests per recorder-rate measurement (made in memory first)


def synthetic_run(
    store: Store, n: int, concurrency: int = 64, output_tokens: int = 64, seed: int = 0
) -> tuple[int, float, Recorder]:
    """Write an ``n``-request completed run through the recorder; return (run id, seconds
    spent writing, the recorder with its running accumulators)."""
    rng = random.Random(seed)
    t_write = time.perf_counter()
    run_id = store.create_run(
        mode="concurrency",
        engine="native",
        model="synthetic",
        accelerator="cpu",
        config={"requests": n, "concurrency": concurrency},
        concurrency=concurrency,
        name=f"render benchmark {n}",
    )
    # Written as a run writes them: finished requests through the recorder (batched writes).
    recorder = Recorder(store, run_id)
    recorder.start()
    recorder.t0 = 0.0
    free_at = [0.0] * concurrency  # each slot sends its next request when the last one ends
    for i in range(n):
        w = i % concurrency
        start = free_at[w]
        ttft = 0.02 + rng.expovariate(1 / 0.03)
        gap = 0.008 + rng.random() * 0.004
        chunks = tuple(start + ttft + k * gap for k in range(output_tokens))
        free_at[w] = chunks[-1]
        done = Completion(i, f"r{i}", start, chunks[-1], chunks, 128, output_tokens, None, chunks[0], start, None)
        recorder.put(done)
    recorder.close()
    records = recorder.records()
    duration = max(r.end_s for r in records)
    points: list[tuple[float, str, float | None]] = []
    for t in range(int(duration) + 1):
        points += [
            (float(t), SERIES_OUTPUT_TOK_S, concurrency / gap),
            (float(t), SERIES_IN_FLIGHT, float(concurrency)),
            (float(t), SERIES_DONE, float(min(n, t * concurrency))),
            (float(t), SERIES_MEM_ALLOCATED, 1.0),
            (float(t), SERIES_MEM_RESERVED, 1.2),
            (float(t), SERIES_MEM_PEAK, 1.3),
        ]
    store.add_points(run_id, points)
    store.finish_run(run_id, "completed", summary=summarize(records, peak_memory_gib=1.3, max_concurrency=concurrency))
    return run_id, time.perf_counter() - t_write, recorder


def recorder_rate(store: Store, n: int, output_tokens: int = 64, seed: int = 1) -> float:
    """Requests per second the recorder takes and stores: ``n`` finished requests of
    ``output_tokens`` chunks, made beforehand, handed over as fast as a sender can, until
    ``close()`` has written the last one (the accumulators, the live summary's sketches and the
    SQLite writes all included). The client must never wait on this."""
    rng = random.Random(seed)
    run_id = store.create_run(mode="concurrency", engine="native", model="synthetic", accelerator="cpu",
                              config={"requests": n}, name=f"recorder rate {n}")  # fmt: skip
    done = []
    for i in range(n):
        start = i * 0.001
        chunks = tuple(start + 0.02 + rng.random() * 0.01 + k * 0.01 for k in range(output_tokens))
        done.append(Completion(i, f"r{i}", start, chunks[-1], chunks, 128, output_tokens, None, chunks[0], start, None))
    recorder = Recorder(store, run_id)
    recorder.start()
    recorder.t0 = 0.0
    t0 = time.perf_counter()
    for c in done:
        recorder.put(c)
    recorder.close()
    rate = n / (time.perf_counter() - t0)
    assert store.sample_count(run_id) == n, "the recorder lost requests"
    store.delete_runs([run_id])
    return rate


def _time(fn: Callable[[], Any], repeat: int) -> tuple[float, Any]:
    """Median milliseconds of ``repeat`` calls, and the last result."""
    times, result = [], None
    for _ in range(repeat):
        t0 = time.perf_counter()
        result = fn()
        times.append((time.perf_counter() - t0) * 1000)
    return statistics.median(times), result


def measure(sizes: Sequence[int], repeat: int) -> list[dict[str, Any]]:
    rows = []
    with tempfile.TemporaryDirectory(prefix="moebench-render-") as tmp:
        store = Store(Path(tmp) / "render.sqlite")
        for n in sizes:
            rates = [recorder_rate(store, min(n, RATE_SAMPLE), seed=k) for k in range(repeat)]
            run_id, write_s, recorder = synthetic_run(store, n)
            summary = store.get_run(run_id).summary  # type: ignore[union-attr]
            # What the sampler does once a second during a run: the live summary from the accumulators.
            live_summary, _ = _time(lambda rc=recorder, s=summary: rc.live_summary(s.duration_s), repeat)

            live_read, live = _time(lambda r=run_id: data.load_live(store, r), repeat)
            live_build, figs = _time(lambda lv=live, s=summary: data.live_figures(lv, s), repeat)
            live_json, _ = _time(lambda fs=figs: [f.to_json() for f in fs.values()], repeat)

            def results_page(r: int = run_id, s: Any = summary) -> list[Any]:
                df = data.runs_frame(store.list_runs())
                chosen = df[df["run_id"] == r]
                detail = data.live_figures(data.load_live(store, r, window=data.DETAIL_WINDOW), s)
                return [
                    charts.compare_bars(chosen),
                    charts.latency_throughput_scatter(df, highlight=[r]),
                    *detail.values(),
                ]

            res_build, res_figs = _time(results_page, repeat)
            res_json, _ = _time(lambda fs=res_figs: [f.to_json() for f in fs], repeat)
            rows.append(
                {
                    "requests": n,
                    "write_s": write_s,
                    "recorder_rps": statistics.median(rates),
                    "recorder_rps_min": min(rates),
                    "live_read_ms": live_read,
                    "live_build_ms": live_build,
                    "live_json_ms": live_json,
                    "live_summary_ms": live_summary,
                    "live_total_ms": live_read + live_build + live_json,
                    "results_build_ms": res_build,
                    "results_json_ms": res_json,
                    "results_total_ms": res_build + res_json,
                    "points_drawn": len(figs["latency"].data[0].x),
                }
            )
        store.close()
    return rows


def print_table(rows: list[dict[str, Any]]) -> None:
    header = (
        f"{'requests':>9} {'write s':>8} {'recorder req/s':>15} | {'summary':>8} | "
        f"{'live read':>9} {'build':>7} {'json':>7} {'total ms':>9} | "
        f"{'results build':>13} {'json':>7} {'total ms':>9} | {'points':>6}"
    )
    print(header)
    print("-" * len(header))
    for r in rows:
        print(
            f"{r['requests']:>9,} {r['write_s']:>8.2f} {r['recorder_rps']:>8,.0f} ({r['recorder_rps_min']:>5,.0f}) | "
            f"{r['live_summary_ms']:>8.1f} | "
            f"{r['live_read_ms']:>9.1f} {r['live_build_ms']:>7.1f} "
            f"{r['live_json_ms']:>7.1f} {r['live_total_ms']:>9.1f} | {r['results_build_ms']:>13.1f} "
            f"{r['results_json_ms']:>7.1f} {r['results_total_ms']:>9.1f} | {r['points_drawn']:>6}"
        )
    print(
        "\nlive: one refresh of the live fragment (window of the newest "
        "requests + per-second series -> 6 figures -> JSON); results: the Results page's comparison bars, "
        "scatter and one run's detail charts. Medians; 'write s': the recorder's time to take and store the run; "
        "'summary': the live summary from the recorder's accumulators (the runner's sampler thread, once a second); "
        f"'recorder req/s': finished requests (64 chunks each) taken and stored per second, {RATE_SAMPLE:,} at most "
        "per measurement, made beforehand, median (lowest) of --repeat measurements."
    )


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m studies.dashboard_render", description=__doc__.splitlines()[0])
    p.add_argument("--sizes", type=int, nargs="+", default=[1000, 10_000, 100_000], help="requests per run")
    p.add_argument("--repeat", type=int, default=3, help="timed repetitions (median reported)")
    args = p.parse_args(argv)
    if any(n < 1 for n in args.sizes) or args.repeat < 1:
        print("error: sizes and --repeat must be at least 1", file=sys.stderr)
        return 2
    print_table(measure(args.sizes, args.repeat))
    return 0


if __name__ == "__main__":
    sys.exit(main())
