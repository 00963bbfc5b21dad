"""vLLM's ``routed_experts`` field (engines.routing.counts_from_routed_experts), decoded the way vLLM
encodes it (vllm/utils/serial_utils.py numpy2base64: ``np.save`` then base64), and refused in one line
when it is not that. The vLLM CPU build here cannot produce the field (docs/engines.md says why),
so these payloads are built with vLLM's own encoding, not recorded from a server."""

from __future__ import annotations

import base64
import io
from typing import Any

import numpy as np
import pytest

from engines.routing import check_routing, counts_from_routed_experts


def _b64(arr: np.ndarray) -> str:
    with io.BytesIO() as buf:
        np.save(buf, arr, allow_pickle=False)
        return base64.b64encode(buf.getbuffer()).decode("ascii")


@pytest.mark.parametrize("dtype", [np.uint8, np.uint16, np.int32])  # the dtypes vLLM documents
def test_routed_experts_become_counts_split_into_prompt_and_generated(dtype: type) -> None:
    # 5 prompt tokens + 3 generated = 8 tokens: 7 rows (the last sampled token was never forwarded)
    rng = np.random.default_rng(0)
    ids = rng.integers(0, 8, size=(7, 2, 2)).astype(dtype)
    counts, why = counts_from_routed_experts(_b64(ids), prompt_tokens=5, num_experts=8)
    assert why is None and counts.shape == (2, 2, 8)
    for layer in range(2):
        assert counts[0, layer].tolist() == np.bincount(ids[:5, layer].reshape(-1), minlength=8).tolist()
        assert counts[1, layer].tolist() == np.bincount(ids[5:, layer].reshape(-1), minlength=8).tolist()
    assert counts.sum() == 7 * 2 * 2
    assert check_routing(counts, None)[1] is None  # what the recorder takes
    # routed_experts_prompt_start=2: the first two prompt rows were left out by the server
    skipped, _ = counts_from_routed_experts(_b64(ids[2:]), prompt_tokens=5, num_experts=8, prompt_start=2)
    assert skipped[0].sum() == 3 * 2 * 2 and skipped[1].sum() == 2 * 2 * 2


@pytest.mark.parametrize(
    ("payload", "reason"),
    [
        (12, "is a int, not base64 text"),
        ("not base64!!", "not base64"),
        (base64.b64encode(b"just bytes").decode(), "not a base64 .npy array"),
        (_b64(np.zeros((3, 2), dtype=np.int32)), "not integer ids [tokens, layers, top-k]"),
        (_b64(np.zeros((3, 2, 2), dtype=np.float32)), "float32"),
        (_b64(np.full((3, 2, 2), 9, dtype=np.int32)), "names expert 9, outside the model's 8"),
    ],
)
def test_bad_routed_experts_say_why_in_one_line(payload: object, reason: str) -> None:
    counts, why = counts_from_routed_experts(payload, prompt_tokens=2, num_experts=8)
    assert counts is None and reason in why and "\n" not in why


def test_an_oversized_field_is_refused_before_decoding(monkeypatch: pytest.MonkeyPatch) -> None:
    import engines.routing as routing

    monkeypatch.setattr(routing, "ROUTED_EXPERTS_MAX_B64", 1024)
    counts, why = counts_from_routed_experts("A" * 4096, prompt_tokens=2, num_experts=8)
    assert counts is None and "over the 0 MiB cap" in why


def _recording(tmp_path: object) -> tuple[Any, int, Any]:
    """A real store (SQLite in ``tmp_path``), a run in it and its started recorder, clock at 0."""
    from pathlib import Path

    from bench.run.recorder import Recorder
    from bench.store import Store

    store = Store(Path(str(tmp_path)) / "r.sqlite")
    run = store.create_run(mode="latency", engine="openai", model="m", accelerator="cpu", config={})
    rec = Recorder(store, run)
    rec.start()
    rec.t0 = 0.0
    return store, run, rec


def test_the_recorder_sums_good_routing_and_notes_the_first_bad_payload(tmp_path: object) -> None:
    """Through the real recorder and store: requests with routing counts are summed (prompt and
    generated, by 10 s window); a wrong shape, a float array and a string are left out with the
    first one's reason; every request is still recorded and counted."""
    from bench.send.core import Completion
    from engines.routing import served_record

    store, run, rec = _recording(tmp_path)
    good = np.ones((2, 3, 4), dtype=np.int64)
    payloads = [good, good * 2, np.ones((2, 2, 4), dtype=np.int64), np.ones((2, 3, 4)), "garbage", good]
    for i, routing in enumerate(payloads):
        t = 3.0 * i
        rec.put(Completion(i, f"r{i}", t, t + 1, (t + 0.5, t + 1), 4, 2, None, t + 0.5, t, None, routing=routing))
    rec.close()
    assert rec.done == 6 and store.sample_count(run) == 6  # nothing else lost
    assert rec.routing_requests == 3 and rec.routing_phases.tolist() == (good * 4).tolist()
    assert rec.routing_error == (
        "request r2: routing shape (2, 2, 4), unlike the run's earlier requests' (2, 3, 4); its routing is left out"
    )
    layout = {"top_k": 2, "n_group": 1}
    record = served_record(rec.routing_phases, layout, rec.routing_windows, rec.routing_requests)
    assert [w["t_s"] for w in record["windows"]] == [0.0, 10.0]  # requests 0, 1 end by 10 s; request 5 at 16 s
    assert record["counts"] == (good * 8).tolist()[0] and record["tokens"] == [8 * 4 // 2] * 3


def test_sglang_raw_int32_ids_drop_the_dense_layers_and_skip_placeholders() -> None:
    """SGLang's encoding: raw int32 [tokens - 1, hidden layers, top-k]; the tiny model's layer 0 is
    dense (its column is not routing), -1 marks a slot with no expert."""
    from engines.models import TINY_CONFIG
    from engines.routing import decode_routed_experts, layout_from_config

    layout = layout_from_config(TINY_CONFIG, "test")
    assert layout["moe_layers"] == [1, 2] and layout["hidden_layers"] == 3 and layout["num_experts"] == 8
    full = np.zeros((4, 3, 2), dtype=np.int32)
    full[:, 1:, 0] = 5
    full[:, 1:, 1] = [[1, 2], [3, 4], [6, 7], [-1, -1]]
    ids, why = decode_routed_experts(base64.b64encode(full.tobytes()).decode(), layout)
    assert why is None and ids.shape == (4, 2, 2) and (ids[:, :, 0] == 5).all()
    counts, why = counts_from_routed_experts(base64.b64encode(full.tobytes()).decode(), 2, 8, layout=layout)
    assert why is None
    assert counts[0, 0].tolist() == [0, 1, 0, 1, 0, 2, 0, 0]  # rows 0-1: the prompt's
    assert counts[1, 1].tolist() == [0, 0, 0, 0, 0, 2, 0, 1]  # rows 2-3, the -1 not counted
    bad = [
        (base64.b64encode(b"\x00" * 10).decode(), "neither an .npy array nor int32 ids [tokens, 3 layers, top-2]"),
        (_b64(np.zeros((3, 4, 2), dtype=np.int32)), "has 4 layers; the model has 2 MoE layers of 3"),
        (base64.b64encode(np.full((1, 3, 2), -3, dtype=np.int32).tobytes()).decode(), "names expert -3"),
    ]
    for payload, reason in bad:
        ids, why = decode_routed_experts(payload, layout)
        assert ids is None and reason in why, why


@pytest.mark.parametrize("encoding", ["sglang", "vllm"])
def test_the_fast_path_counts_as_decode_then_count_does(encoding: str) -> None:
    """routed_counts (one bincount, what the client runs per request) against the plain decode and
    a per-layer count, on random ids with placeholders, both encodings, several prompt splits."""
    from engines.models import TINY_CONFIG
    from engines.routing import decode_routed_experts, layout_from_config, routed_counts

    def counts_from_ids(ids: np.ndarray, prompt: int | None, experts: int) -> np.ndarray:
        """The reference: one bincount per (phase, layer), placeholders dropped."""
        split = len(ids) if prompt is None else max(0, min(len(ids), prompt))
        out = np.zeros((2, ids.shape[1], experts), dtype=np.int64)
        for phase, part in ((0, ids[:split]), (1, ids[split:])):
            for layer in range(ids.shape[1]):
                flat = part[:, layer].reshape(-1)
                out[phase, layer] = np.bincount(flat[flat >= 0], minlength=experts)
        return out

    layout = layout_from_config({**TINY_CONFIG, "num_hidden_layers": 5, "n_routed_experts": 16}, "test")
    rng = np.random.default_rng(3)
    for rows in (0, 1, 9, 40):
        ids = rng.integers(-1, 16, size=(rows, 4, 2)).astype(np.int32)
        if encoding == "sglang":
            full = np.zeros((rows, 5, 2), dtype=np.int32)
            full[:, 1:] = ids
            payload = base64.b64encode(full.tobytes()).decode()
        else:
            payload = _b64(ids)
        for prompt in (None, 0, 3, rows + 5):
            fast, why = routed_counts(payload, layout, prompt)
            assert why is None and fast.dtype == np.uint16 and fast.shape == (2, 4, 16)
            slow = counts_from_ids(decode_routed_experts(payload, layout)[0], prompt, 16)
            assert fast.tolist() == slow.tolist(), (rows, prompt)


def _sglang(ids: np.ndarray, hidden: int, dense: int) -> str:
    full = np.zeros((ids.shape[0], hidden, ids.shape[2]), dtype=np.int32)
    full[:, dense:] = ids
    return base64.b64encode(full.tobytes()).decode()


def test_ids_counted_in_a_batch_equal_each_request_counted_alone() -> None:
    """read_routed keeps SGLang's raw ids (RoutedIds) for count_routed to count many at once: the
    batch's counts equal the sum of routed_counts over its requests, whatever their rows and prompt
    splits (0 rows, all prompt, none), placeholders included; vLLM's .npy is counted at once."""
    from engines.models import TINY_CONFIG
    from engines.routing import (
        DEFER_MAX_BYTES,
        RoutedIds,
        count_routed,
        layout_from_config,
        read_routed,
        routed_counts,
    )

    layout = layout_from_config({**TINY_CONFIG, "num_hidden_layers": 5, "n_routed_experts": 16}, "test")
    rng = np.random.default_rng(7)
    items, alone = [], np.zeros((2, 4, 16), dtype=np.int64)
    for rows, prompt in ((0, 3), (1, None), (9, 4), (40, 0), (12, 50), (30, 29)):
        payload = _sglang(rng.integers(-1, 16, size=(rows, 4, 2)).astype(np.int32), 5, 1)
        got, why = read_routed(payload, layout, prompt)
        assert why is None and isinstance(got, RoutedIds), why
        items.append(got)
        alone += routed_counts(payload, layout, prompt)[0]
    counts, bad = count_routed(items)
    assert bad == [] and counts.dtype == np.int64 and counts.tolist() == alone.tolist()
    npy, why = read_routed(_b64(rng.integers(0, 16, size=(5, 4, 2)).astype(np.int32)), layout, 2)
    assert why is None and not isinstance(npy, RoutedIds) and npy.shape == (2, 4, 16)
    for payload, reason in (("not base64!!", "not base64"), (base64.b64encode(b"\x00" * 12).decode(), "neither")):
        got, why = read_routed(payload, layout, 2)
        assert got is None and reason in why, why
    # ids over DEFER_MAX_BYTES (a DeepSeek-V3 request: ~2 kB a token) are counted at once
    big = _sglang(rng.integers(0, 16, size=(DEFER_MAX_BYTES // 32 + 1, 4, 2)).astype(np.int32), 5, 1)
    got, why = read_routed(big, layout, 7)
    assert why is None and not isinstance(got, RoutedIds) and got.tolist() == routed_counts(big, layout, 7)[0].tolist()


def test_a_request_naming_an_unknown_expert_is_left_out_of_its_batch_alone() -> None:
    from engines.models import TINY_CONFIG
    from engines.routing import count_routed, layout_from_config, read_routed, routed_counts

    layout = layout_from_config(TINY_CONFIG, "test")  # 3 layers (1 dense), 8 experts, top-2
    ok = [_sglang(np.full((4, 2, 2), e, dtype=np.int32), 3, 1) for e in (1, 5)]
    wrong = _sglang(np.full((3, 2, 2), 8, dtype=np.int32), 3, 1)
    items = [read_routed(p, layout, 2)[0] for p in (ok[0], wrong, ok[1])]
    counts, bad = count_routed(items)
    assert bad == [(1, "routed_experts names expert 8, outside the model's 8")]
    assert counts.tolist() == (routed_counts(ok[0], layout, 2)[0] + routed_counts(ok[1], layout, 2)[0]).tolist()
    counts, bad = count_routed([items[1]])  # a batch of only bad ones counts nothing
    assert [i for i, _ in bad] == [0] and counts.sum() == 0 and counts.shape == (2, 2, 8)
    # a layout at odds with itself (MoE layer 2 of 2 layers) is a reason, never an exception
    odd = {"moe_layers": [1, 2], "num_experts": 4, "top_k": 2}
    got, why = read_routed(base64.b64encode(np.zeros((2, 2, 2), dtype=np.int32).tobytes()).decode(), odd, 1)
    assert got is None and why == "routed_experts has 2 layers; the model's MoE layers go up to index 2"


def test_a_batch_that_cannot_be_counted_leaves_its_routing_out_and_the_recorder_going(
    tmp_path: object, monkeypatch: pytest.MonkeyPatch
) -> None:
    from bench.run import recorder as recorder_mod
    from bench.send.core import Completion
    from engines.models import TINY_CONFIG
    from engines.routing import layout_from_config, read_routed

    def broken(items: list) -> None:
        raise MemoryError("no room")

    monkeypatch.setattr(recorder_mod, "count_routed", broken)
    layout = layout_from_config(TINY_CONFIG, "test")
    store, run, rec = _recording(tmp_path)
    routing = read_routed(_sglang(np.ones((3, 2, 2), dtype=np.int32), 3, 1), layout, 2)[0]
    n = recorder_mod.ROUTED_IDS_BATCH + 5
    for i in range(n):
        rec.put(Completion(i, f"r{i}", 0.0, 1.0, (0.5, 1.0), 2, 2, None, 0.5, 0.0, None, routing=routing))
    rec.close()
    assert rec.done == n and store.sample_count(run) == n  # every request recorded, after the failed batch too
    assert rec.routing_requests == 0 and rec.routing_error == (
        "request r0: routing not counted (MemoryError: no room); its routing is left out"
    )


def test_the_recorder_counts_routed_ids_by_window_and_keeps_the_run(tmp_path: object) -> None:
    """Through the real recorder and store, more requests than one counting batch: ids summed as
    counted alone, by 10 s window; a request naming an unknown expert left out with its reason."""
    from bench.run import recorder as recorder_mod
    from bench.send.core import Completion
    from engines.models import TINY_CONFIG
    from engines.routing import layout_from_config, read_routed, routed_counts

    layout = layout_from_config(TINY_CONFIG, "test")
    store, run, rec = _recording(tmp_path)
    rng = np.random.default_rng(1)
    n = 4 * recorder_mod.ROUTED_IDS_BATCH + 44
    want, windows = np.zeros((2, 2, 8), dtype=np.int64), {}
    for i in range(n):
        ids = rng.integers(-1, 8, size=(int(rng.integers(1, 20)), 2, 2)).astype(np.int32)
        if i == 17:
            ids[0, 0, 0] = 11
        payload = _sglang(ids, 3, 1)
        t = 0.1 * i
        if i != 17:
            one = routed_counts(payload, layout, 5)[0].astype(np.int64)
            want += one
            windows[int((t + 1) // 10)] = windows.get(int((t + 1) // 10), 0) + one.sum(axis=0)
        routing = read_routed(payload, layout, 5)[0]
        rec.put(Completion(i, f"r{i}", t, t + 1, (t + 0.5, t + 1), 5, 2, None, t + 0.5, t, None, routing=routing))
    rec.close()
    assert rec.done == n and store.sample_count(run) == n
    assert rec.routing_requests == n - 1 and rec.routing_phases.tolist() == want.tolist()
    assert sorted(rec.routing_windows) == sorted(windows) == [0, 1, 2, 3]
    assert all(rec.routing_windows[w].tolist() == windows[w].tolist() for w in windows)
    assert (
        rec.routing_error == "request r17: routing routed_experts names expert 11, outside the model's 8; "
        "its routing is left out"
    )


def test_uint64_ids_count_as_int32_ids_and_a_lying_header_is_a_reason() -> None:
    """An .npy of uint64 ids in range counts as the same ids in int32 (it was a TypeError); one
    whose header declares (2**40, 2, 2) over 32 bytes is refused before any array is made (it was
    a MemoryError)."""
    ids = np.random.default_rng(1).integers(0, 8, size=(7, 2, 2))
    wide, why = counts_from_routed_experts(_b64(ids.astype(np.uint64)), prompt_tokens=5, num_experts=8)
    narrow, _ = counts_from_routed_experts(_b64(ids.astype(np.int32)), prompt_tokens=5, num_experts=8)
    assert why is None and wide.tolist() == narrow.tolist()
    with io.BytesIO() as buf:
        np.lib.format.write_array_header_1_0(buf, {"descr": "<i4", "fortran_order": False, "shape": (2**40, 2, 2)})
        lying = base64.b64encode(buf.getvalue() + bytes(32)).decode()
    counts, why = counts_from_routed_experts(lying, prompt_tokens=5, num_experts=8)
    assert counts is None
    assert why == "routed_experts' .npy header says shape (1099511627776, 2, 2) of int32; 32 bytes follow it"


@pytest.mark.parametrize("rows", [20, 2000])  # SGLang's raw ids kept for a batch (RoutedIds), and counted at once
def test_more_rows_than_the_request_has_tokens_are_a_reason_in_either_path(rows: int) -> None:
    """Rows past prompt + max_tokens + ROUTED_ROWS_SLACK are refused, whether the ids are small
    enough to be kept uncounted (RoutedIds) or counted at once; a top-k other than the model's too."""
    from engines.models import TINY_CONFIG
    from engines.routing import ROUTED_ROWS_SLACK, layout_from_config, read_routed, routed_rows_max

    layout = layout_from_config(TINY_CONFIG, "")
    raw = base64.b64encode(np.zeros((rows, 3, 2), dtype=np.int32).tobytes()).decode()
    most = routed_rows_max(2, 4)
    assert most == 6 + ROUTED_ROWS_SLACK
    value, why = read_routed(raw, layout, 2, max_rows=most if rows > most else None)
    if rows > most:
        assert value is None and why.startswith(f"routed_experts has {rows:,} rows (tokens); the request has at most")
    value, why = read_routed(raw, layout, 2, max_rows=rows)
    assert why is None and value is not None
    top_500 = _b64(np.zeros((rows, 2, 500), dtype=np.int32))
    value, why = read_routed(top_500, layout, 2)
    assert value is None and why == "routed_experts has top-500 ids a token; the model routes to 2"
