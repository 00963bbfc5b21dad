"""Prometheus parsing and the counter-to-rate step every server engine uses.

The parser is ``prometheus_client``'s (CONVENTIONS rule 22). The two hand-written parsers it
replaced are kept below, frozen, as the reference: on every sample page (the exporter pages in
tests/data/telemetry, a vLLM page written by ``prometheus_client``'s own exposition as vLLM's
is, a Triton page in prometheus-cpp's layout) the library path gives the same names, labels and
values, and the line-by-line fallback gives the same as the library path.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable
from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from engines.prometheus import (
    CounterRates,
    PromSample,
    parse_prometheus,
    parse_prometheus_by,
    parse_prometheus_samples,
    sample_labels,
)

DATA = Path(__file__).resolve().parent.parent / "data" / "telemetry"


# --- the replaced parsers, frozen as they were (engines/prometheus.py, engines/telemetry.py) ---


def old_parse_prometheus(text: str) -> dict[str, float]:
    out: dict[str, float] = {}
    for line in text.splitlines():
        if not line or line.startswith("#"):
            continue
        name_part, _, rest = line.rpartition("}") if "}" in line else ("", "", line)
        if name_part:
            name = name_part.split("{", 1)[0]
            fields = rest.split()
        else:
            parts = line.split()
            name, fields = parts[0], parts[1:]
        if not fields:
            continue
        try:
            value = float(fields[0])
        except ValueError:
            continue
        out[name] = out.get(name, 0.0) + value
    return out


def old_parse_prometheus_by(text: str, label: str, names: Iterable[str]) -> dict[tuple[str, str], float]:
    wanted = set(names)
    key = f'{label}="'
    out: dict[tuple[str, str], float] = {}
    for line in text.splitlines():
        if not line or line.startswith("#") or "{" not in line:
            continue
        name, _, rest = line.partition("{")
        if name not in wanted:
            continue
        labels, _, tail = rest.rpartition("}")
        at = labels.find(key)
        if at < 0:
            continue
        value_of = labels[at + len(key) :].split('"', 1)[0]
        fields = tail.split()
        try:
            value = float(fields[0])
        except (IndexError, ValueError):
            continue
        out[(name, value_of)] = out.get((name, value_of), 0.0) + value
    return out


_SAMPLE = re.compile(r"^([A-Za-z_:][A-Za-z0-9_:]*)(?:\{(.*)\})?\s+(\S+)(?:\s+-?\d+)?\s*$")
_LABEL = re.compile(r'\s*([A-Za-z_][A-Za-z0-9_]*)\s*=\s*"((?:[^"\\]|\\.)*)"\s*(?:,|$)')
_UNESCAPE = {"\\\\": "\\", '\\"': '"', "\\n": "\n"}


def old_parse_prometheus_samples(text: str) -> list[PromSample]:
    out = []
    for line in text.splitlines():
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        match = _SAMPLE.match(line)
        if match is None:
            continue
        name, label_text, raw = match.groups()
        labels: dict[str, str] = {}
        if label_text:
            pos = 0
            for pair in _LABEL.finditer(label_text):
                if pair.start() != pos:
                    break
                labels[pair.group(1)] = re.sub(r"\\[\\\"n]", lambda m: _UNESCAPE[m.group(0)], pair.group(2))
                pos = pair.end()
            if label_text[pos:].strip():
                continue
        try:
            value = float(raw)
        except ValueError:
            continue
        out.append(PromSample(name, labels, value))
    return out


# --- sample pages ----------------------------------------------------------------------------


def vllm_page() -> str:
    """A vLLM V1 /metrics page as vLLM writes it: through prometheus_client's exposition, two
    data-parallel engines, counters (``_total`` and ``_created``), histograms, the cache info
    gauge, and a model path whose label value needs escapes."""
    reg = CollectorRegistry()
    labels = ["model_name", "engine"]
    model = 'C:\\models\\"ds"\nv3'
    running = Gauge("vllm:num_requests_running", "Requests in model execution batches.", labels, registry=reg)
    waiting = Gauge("vllm:num_requests_waiting", "Requests waiting to be processed.", labels, registry=reg)
    kv = Gauge("vllm:kv_cache_usage_perc", "KV-cache usage. 1 means 100 percent usage.", labels, registry=reg)
    counters = {
        name: Counter(name, f"{name} help", labels, registry=reg)
        for name in (
            "vllm:num_preemptions",
            "vllm:prompt_tokens",
            "vllm:generation_tokens",
            "vllm:prefix_cache_queries",
            "vllm:prefix_cache_hits",
        )
    }
    ttft = Histogram("vllm:time_to_first_token_seconds", "TTFT.", labels, buckets=(0.01, 0.1, 1.0, 10.0), registry=reg)
    info = Gauge(
        "vllm:cache_config_info", "Information of the LLMEngine CacheConfig",
        ["block_size", "cache_dtype", "num_gpu_blocks", "x"], registry=reg,
    )  # fmt: skip
    info.labels("128", "auto", "2427", "a,b").set(1)
    for k in ("0", "1"):
        running.labels(model, k).set(3 + int(k))
        waiting.labels(model, k).set(1)
        kv.labels(model, k).set(0.25 * (1 + int(k)))
        for i, c in enumerate(counters.values()):
            c.labels(model, k).inc(100 * (i + 1) + int(k))
        for seconds in (0.005, 0.05, 0.5, 5.0, math.inf):
            ttft.labels(model, k).observe(seconds)
    eplb = Gauge("vllm:eplb_balancedness", "EPLB balancedness.", registry=reg)
    eplb.set(0.93)
    return generate_latest(reg).decode()


# Triton's /metrics in prometheus-cpp's layout: its counters carry no "_total".
TRITON_PAGE = """\
# HELP nv_inference_request_success Number of successful inference requests, all batch sizes
# TYPE nv_inference_request_success counter
nv_inference_request_success{model="tiny-deepseek-v3",version="1"} 12
# HELP nv_inference_request_failure Number of failed inference requests, all batch sizes
# TYPE nv_inference_request_failure counter
nv_inference_request_failure{model="tiny-deepseek-v3",reason="REJECTED",version="1"} 0
nv_inference_request_failure{model="tiny-deepseek-v3",reason="BACKEND",version="1"} 1
# HELP nv_inference_count Number of inferences performed (does not include cached requests)
# TYPE nv_inference_count counter
nv_inference_count{model="tiny-deepseek-v3",version="1"} 12
# HELP nv_inference_pending_request_count Instantaneous number of pending requests awaiting execution per-model.
# TYPE nv_inference_pending_request_count gauge
nv_inference_pending_request_count{model="tiny-deepseek-v3",version="1"} 2
# HELP nv_inference_first_response_histogram_ms Duration from request to first response in milliseconds
# TYPE nv_inference_first_response_histogram_ms histogram
nv_inference_first_response_histogram_ms_count{model="tiny-deepseek-v3",version="1"} 12
nv_inference_first_response_histogram_ms_sum{model="tiny-deepseek-v3",version="1"} 95
nv_inference_first_response_histogram_ms_bucket{model="tiny-deepseek-v3",version="1",le="100"} 10
nv_inference_first_response_histogram_ms_bucket{model="tiny-deepseek-v3",version="1",le="500"} 12
nv_inference_first_response_histogram_ms_bucket{model="tiny-deepseek-v3",version="1",le="+Inf"} 12
# HELP nv_inference_queue_summary_us Summary of inference queuing duration in microseconds
# TYPE nv_inference_queue_summary_us summary
nv_inference_queue_summary_us_count{model="tiny-deepseek-v3",version="1"} 12
nv_inference_queue_summary_us_sum{model="tiny-deepseek-v3",version="1"} 310
nv_inference_queue_summary_us{model="tiny-deepseek-v3",version="1",quantile="0.5"} 21
nv_inference_queue_summary_us{model="tiny-deepseek-v3",version="1",quantile="0.99"} NaN
# HELP nv_cpu_utilization CPU utilization rate [0.0 - 1.0]
# TYPE nv_cpu_utilization gauge
nv_cpu_utilization 0.070999999999999994
# HELP nv_cpu_memory_used_bytes CPU used memory (RAM), in bytes
# TYPE nv_cpu_memory_used_bytes gauge
nv_cpu_memory_used_bytes 9350000000
# HELP nv_gpu_utilization GPU utilization rate [0.0 - 1.0)
# TYPE nv_gpu_utilization gauge
nv_gpu_utilization{gpu_uuid="GPU-00000000-0000-0000-0000-0000000000a0"} 0.42
# HELP nv_gpu_memory_used_bytes GPU used memory, in bytes
# TYPE nv_gpu_memory_used_bytes gauge
nv_gpu_memory_used_bytes{gpu_uuid="GPU-00000000-0000-0000-0000-0000000000a0"} 31457280000
"""

# The hand-written page of test_vllm_options: HELP/TYPE for one metric only, an info metric
# whose label value holds a comma, an unlabelled process metric.
VLLM_HAND_PAGE = """# HELP vllm:kv_cache_usage_perc KV-cache usage. 1 means 100 percent usage.
# TYPE vllm:kv_cache_usage_perc gauge
vllm:kv_cache_usage_perc{engine="0",model_name="m"} 0.25
vllm:num_requests_running{engine="0",model_name="m"} 3.0
vllm:generation_tokens_total{engine="0",model_name="m"} 50.0
vllm:cache_config_info{block_size="128",cache_dtype="auto",num_gpu_blocks="2427",x="a,b"} 1.0
process_open_fds 12
"""


def pages() -> dict[str, str]:
    out = {p.stem: p.read_text(encoding="utf-8") for p in sorted(DATA.glob("*_exporter.txt"))}
    out.update(vllm=vllm_page(), triton=TRITON_PAGE, vllm_hand=VLLM_HAND_PAGE)
    return out


PAGES = pages()


def same(a: float, b: float) -> bool:
    return a == b or (math.isnan(a) and math.isnan(b))


def as_rows(samples: list[PromSample]) -> list[tuple[str, dict[str, str], str]]:
    return [(s.name, s.labels, repr(s.value)) for s in samples]  # repr: NaN equals NaN


# --- tests -----------------------------------------------------------------------------------


def test_counter_rates_between_scrapes() -> None:
    rates = CounterRates()
    assert rates.update({"a": 10.0}, now=100.0) == {}  # the first scrape is the baseline
    assert rates.update({"a": 30.0, "b": 5.0}, now=102.0) == {"a": 10.0}  # b is new: no rate yet
    assert rates.update({"a": 0.0, "b": 9.0}, now=104.0) == {"a": 0.0, "b": 2.0}  # a restarted: 0, not negative
    assert rates.update({"a": 4.0}, now=104.0) == {}  # no time passed


def test_parse_sums_labels() -> None:
    text = '# HELP x\nx{a="1"} 2\nx{a="2"} 3\ny 4.5\n'
    assert parse_prometheus(text) == {"x": 5.0, "y": 4.5}


def test_sample_pages_cover_what_the_old_parsers_were_given() -> None:
    assert {"dcgm_exporter", "npu_exporter", "mlu_exporter", "vllm", "triton", "vllm_hand"} == set(PAGES)
    assert all(len(parse_prometheus_samples(text)) >= 5 for text in PAGES.values())
    for text in PAGES.values():  # the library reads every page whole: none needs the fallback
        assert sum(len(f.samples) for f in text_string_to_metric_families(text)) == len(parse_prometheus_samples(text))


@pytest.mark.parametrize("page", sorted(PAGES))
def test_samples_match_the_old_parser(page: str) -> None:
    text = PAGES[page]
    assert as_rows(parse_prometheus_samples(text)) == as_rows(old_parse_prometheus_samples(text))


@pytest.mark.parametrize("page", sorted(PAGES))
def test_sums_match_the_old_parser(page: str) -> None:
    new, old = parse_prometheus(PAGES[page]), old_parse_prometheus(PAGES[page])
    old = {k: v for k, v in old.items() if math.isfinite(v)}  # a NaN or infinite sum is left out now
    assert list(new) == list(old)
    assert all(same(new[k], old[k]) for k in old)


@pytest.mark.parametrize(
    ("page", "label"),
    [("vllm", "engine"), ("vllm_hand", "engine"), ("dcgm_exporter", "gpu"), ("npu_exporter", "id"),
     ("mlu_exporter", "mlu"), ("triton", "reason"), ("triton", "version")],
)  # fmt: skip
def test_per_label_sums_match_the_old_parser(page: str, label: str) -> None:
    text = PAGES[page]
    names = {s.name for s in parse_prometheus_samples(text)}
    new, old = parse_prometheus_by(text, label, names), old_parse_prometheus_by(text, label, names)
    old = {k: v for k, v in old.items() if math.isfinite(v)}  # a NaN or infinite sum is left out now
    assert new and list(new) == list(old)
    assert all(same(new[k], old[k]) for k in old)


@pytest.mark.parametrize("page", sorted(PAGES))
def test_the_line_by_line_fallback_agrees_with_the_library_path(page: str) -> None:
    """One line the library cannot read sends the page through the fallback (each line on its
    own through the same library parser): it loses that line and nothing else, and names the
    samples as the library path does (counters without ``_total`` included)."""
    text = PAGES[page]
    whole = parse_prometheus_samples(text)
    lines = text.split("\n")
    garbled = "\n".join([*lines[:3], 'broken{gpu="0" 5', *lines[3:]])
    assert as_rows(parse_prometheus_samples(garbled)) == as_rows(whole)
    assert parse_prometheus(garbled).keys() == parse_prometheus(text).keys()


def test_names_are_as_the_page_writes_them() -> None:
    """prometheus_client renames a counter declared without ``_total``; callers look up the name
    the page shows, so the rename is undone. Histogram and summary samples keep their suffixes."""
    from engines import triton, vllm

    t = parse_prometheus(TRITON_PAGE)
    assert t["nv_inference_request_success"] == 12 and t["nv_inference_request_failure"] == 1
    assert not any(name.endswith("_total") for name in t)
    assert set(triton.GAUGES) | set(triton.COUNTERS) <= set(t)
    assert t["nv_inference_first_response_histogram_ms_bucket"] == 34  # summed over le, as before
    assert t["nv_inference_first_response_histogram_ms_count"] == 12
    assert t["nv_inference_queue_summary_us_sum"] == 310
    assert "nv_inference_queue_summary_us" not in t  # a NaN quantile: no sum (never stored as NaN)

    v = parse_prometheus(PAGES["vllm"])
    # (the spec-decode counters exist only on a server with speculative decoding: test_vllm.py)
    assert set(vllm.GAUGES) | {c for c in vllm.COUNTERS if "spec_decode" not in c} <= set(v)
    assert v["vllm:generation_tokens_total"] == 300 + 301
    assert "vllm:generation_tokens_created" in v and "vllm:generation_tokens" not in v
    assert "vllm:time_to_first_token_seconds_bucket" in set(v)  # (its _sum has a NaN sample here: no sum)
    assert parse_prometheus_by(PAGES["vllm"], "engine", vllm.PER_ENGINE)[("vllm:kv_cache_usage_perc", "1")] == 0.5

    d = parse_prometheus(PAGES["dcgm_exporter"])
    assert d["DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION"] == 88213450117  # a DCGM counter without _total

    # a counter declared with _total keeps it; one declared both ways is left as the library reads it
    assert parse_prometheus("# TYPE c_total counter\nc_total 3\n") == {"c_total": 3.0}
    assert parse_prometheus("# TYPE c counter\nc 3\n") == {"c": 3.0}
    assert parse_prometheus("# TYPE c counter\nc_total 3\n") == {"c_total": 3.0}


def test_edge_cases_of_the_text_format() -> None:
    text = (
        "no_help_no_type 1\n"  # neither HELP nor TYPE
        "ts_ms 2 1700000000000\n"  # a timestamp, dropped
        'inf{a="1"} +Inf\n'
        'inf{a="2"} -Inf\n'
        'esc{path="C:\\\\m\\"q\\"",nl="a\\nb",brace="}",comma="x, y"} 4\n'
        "\n"
        "   spaced   5   \n"
        'trailing{a="1",} 6\n'
        "# a free comment\n"
        "exp 1.5e3\n"
    )
    samples = {s.name: s for s in parse_prometheus_samples(text)}
    assert samples["no_help_no_type"].value == 1 and samples["ts_ms"].value == 2
    assert samples["esc"].labels == {"path": 'C:\\m"q"', "nl": "a\nb", "brace": "}", "comma": "x, y"}
    assert samples["spaced"].value == 5 and samples["trailing"].labels == {"a": "1"}
    assert samples["exp"].value == 1500.0
    assert "inf" not in parse_prometheus(text)  # +Inf and -Inf: no sum
    assert parse_prometheus_by(text, "a", ["inf"]) == {}


def test_malformed_lines_are_skipped_where_the_old_parsers_misread_them() -> None:
    """What the old line parsers got wrong and the library does not: an unclosed label set was
    summed under a garbage name, a label was matched by the end of another's name (``le`` in
    ``quantile``, ``engine`` in ``xengine``)."""
    text = 'good{engine="0"} 1\nd{gpu="0" 5\nfoo{xengine="7"} 2\nbad_value{a="1"} 0x10\n'
    assert old_parse_prometheus(text)['d{gpu="0"'] == 5  # the old bug
    assert parse_prometheus(text) == {"good": 1.0, "foo": 2.0}
    assert old_parse_prometheus_by(text, "engine", ["foo"]) == {("foo", "7"): 2.0}  # the old bug
    assert parse_prometheus_by(text, "engine", ["good", "foo"]) == {("good", "0"): 1.0}
    by_le = parse_prometheus_by(TRITON_PAGE, "le", ["nv_inference_queue_summary_us"])
    assert by_le == {} != old_parse_prometheus_by(TRITON_PAGE, "le", ["nv_inference_queue_summary_us"])
    assert parse_prometheus_samples("") == [] and parse_prometheus("# TYPE x\n") == {}


def test_first_labels_of_a_metric_match_vllms_reader() -> None:
    from engines.vllm import prometheus_labels

    for text in (PAGES["vllm"], VLLM_HAND_PAGE):
        got = sample_labels(text, "vllm:cache_config_info")
        assert got == prometheus_labels(text, "vllm:cache_config_info")
        assert got["num_gpu_blocks"] == "2427" and got["x"] == "a,b"
    assert sample_labels(VLLM_HAND_PAGE, "missing") == {} == prometheus_labels(VLLM_HAND_PAGE, "missing")
