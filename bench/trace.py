"""Timestamped traces: read them (Mooncake, plain JSONL, Azure CSV) and make synthetic ones.

A trace is a list of requests, each with its arrival time, its prompt (or prompt length) and
its output length. A ``trace`` workload (:mod:`bench.workloads`) replays one: request ``i``
is due ``(t_i - t_0) x time_scale`` seconds after the run starts
(:class:`bench.send.schedule.TraceSchedule`), so the trace's own bursts and lulls reach the
server, and each request's send lag is measured against that schedule.

Formats (``trace_format``; ``auto`` tells them apart by the file's first line):

- **mooncake**: JSONL, one request per line: ``timestamp`` (ms), ``input_length``,
  ``output_length``, ``hash_ids`` (one id per 512-token block of the prompt; the same id is
  the same block, so requests that share leading ids share a prefix). MoE Bench builds each
  block's tokens from its id (:func:`block_tokens`), so the trace's prefix sharing reaches
  the server token for token.
- **jsonl**: a plain timestamped JSONL: ``timestamp`` (ms), ``output_length``, and either
  ``prompt`` (text) or ``input_length`` (a random prompt of that many tokens).
- **azure**: the Azure LLM inference trace CSV (``TIMESTAMP,ContextTokens,GeneratedTokens``;
  ``TIMESTAMP`` a date-time, ``2023-11-16 18:15:46.6805900``).

A file that cannot be read gives one :class:`engines.errors.WorkloadError` line naming the
file and the line. Timestamps must not go backwards (a trace is in arrival order).

:func:`synth` writes a Mooncake-format trace (bursts, a diurnal rate, prefix groups) for a
user without one: ``python -m bench trace synth --out FILE``.
"""

from __future__ import annotations

import csv
import io
import itertools
import json
import math
import random
import re
import stat
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Literal

from engines.errors import WorkloadError

TraceFormat = Literal["auto", "mooncake", "jsonl", "azure"]
BLOCK_TOKENS = 512  # Mooncake's hash block: 512 tokens per id
MAX_TRACE_BYTES = 1 << 30
MAX_LINE_BYTES = 1 << 20  # a trace line is a few hundred bytes; a prompt line may be long
MAX_LENGTH = 1 << 20  # a length above this is not a request's
MAX_TIMESTAMP_MS = 4_102_444_800_000.0  # 2100-01-01 in ms since 1970: a later timestamp is not a time
MAX_GAP_S = 86_400.0  # a day: a longer wait between two requests (after time_scale) is refused, not waited out
_AZURE_TIME = re.compile(r"(\d{4}-\d{2}-\d{2} \d{2}:\d{2}:\d{2})(?:\.(\d{1,9})\d*)?")  # fraction: digits only


@dataclass(frozen=True)
class TraceRow:
    """One request of a trace: arrival (s, from the file's clock), lengths, and its prompt's
    source: ``hash_ids`` (Mooncake blocks), ``prompt`` (text) or neither (a random prompt)."""

    t_s: float
    input_len: int | None
    output_len: int
    hash_ids: tuple[int, ...] | None = None
    prompt: str | None = None
    line: int = 0  # the file's line, for messages


def _number(v: Any) -> bool:
    """A JSON number that is finite as a float (a 400-digit integer is not: it would overflow)."""
    if isinstance(v, bool) or not isinstance(v, int | float):
        return False
    if isinstance(v, int):
        return abs(v) < 2**63
    return math.isfinite(v)


def _count(obj: dict[str, Any], key: str, where: str, low: int = 1) -> int:
    v = obj.get(key)
    if not _number(v) or v != int(v):
        raise WorkloadError(f"{where}: '{key}' must be a whole number, got {str(v)[:40]!r}")
    if not low <= int(v) <= MAX_LENGTH:
        raise WorkloadError(f"{where}: '{key}' {int(v)} is outside {low}..{MAX_LENGTH}")
    return int(v)


def _timestamp_ms(obj: dict[str, Any], where: str) -> float:
    v = obj.get("timestamp")
    if not _number(v) or not 0 <= v <= MAX_TIMESTAMP_MS:
        raise WorkloadError(
            f"{where}: 'timestamp' must be a number of ms from 0 to {MAX_TIMESTAMP_MS:.0f} (the year 2100), "
            f"got {str(v)[:40]!r}"
        )
    return float(v)


def _json_row(line: str, where: str, fmt: str, line_no: int = 0) -> TraceRow:
    try:
        obj = json.loads(line)
    except (ValueError, RecursionError) as exc:
        raise WorkloadError(f"{where} is not a JSON object ({str(exc)[:80]})") from None
    if not isinstance(obj, dict):
        raise WorkloadError(f"{where} is not a JSON object")
    t = _timestamp_ms(obj, where) / 1000.0
    out = _count(obj, "output_length", where)
    if fmt == "mooncake":
        ids = obj.get("hash_ids")
        if not isinstance(ids, list) or not all(isinstance(h, int) and not isinstance(h, bool) for h in ids):
            raise WorkloadError(f"{where}: 'hash_ids' must be a list of whole numbers")
        n = _count(obj, "input_length", where)
        need = math.ceil(n / BLOCK_TOKENS)
        if len(ids) != need:
            raise WorkloadError(
                f"{where}: {len(ids)} hash_ids for input_length {n} (one per {BLOCK_TOKENS}-token block: {need})"
            )
        return TraceRow(t, n, out, tuple(ids), line=line_no)
    prompt = obj.get("prompt")
    if prompt is not None:
        if not isinstance(prompt, str) or not prompt.strip():
            raise WorkloadError(f"{where}: 'prompt' must be non-empty text")
        return TraceRow(t, None, out, prompt=prompt, line=line_no)
    return TraceRow(t, _count(obj, "input_length", where), out, line=line_no)


def _azure_time(text: str, where: str) -> float:
    """``2023-11-16 18:15:46.6805900`` -> seconds since the epoch (UTC): a date, a time and an
    optional fraction of digits only (no exponent, no ``_``), read to the nanosecond."""
    m = _AZURE_TIME.fullmatch(text.strip())
    try:
        if m is None:
            raise ValueError(text)
        whole = datetime.strptime(m.group(1), "%Y-%m-%d %H:%M:%S").replace(tzinfo=UTC).timestamp()
        return whole + (int(m.group(2)) / 10 ** len(m.group(2)) if m.group(2) else 0.0)
    except ValueError:
        raise WorkloadError(f"{where}: TIMESTAMP {text[:40]!r} is not YYYY-MM-DD HH:MM:SS[.fraction]") from None


def _lines(path: Path) -> Iterator[tuple[int, str]]:
    """The file's lines (a UTF-8 BOM dropped), each read with :data:`MAX_LINE_BYTES` as its hard limit."""
    size = path.stat().st_size
    if size > MAX_TRACE_BYTES:
        raise WorkloadError(f"{path.name} is larger than {MAX_TRACE_BYTES >> 20} MiB")
    with path.open("rb") as fh:
        for n in itertools.count(1):
            raw = fh.readline(MAX_LINE_BYTES + 1)  # never more than one line's worth in memory
            if not raw:
                return
            if len(raw) > MAX_LINE_BYTES:
                raise WorkloadError(f"{path.name} line {n}: over the {MAX_LINE_BYTES:,} bytes a line may hold")
            if n == 1:
                raw = raw.removeprefix(b"\xef\xbb\xbf")
            try:
                yield n, raw.decode("utf-8").rstrip("\r\n")
            except UnicodeDecodeError as exc:
                raise WorkloadError(f"{path.name} line {n} is not UTF-8 text (byte {exc.start})") from None


def detect_format(path: Path) -> str:
    """``mooncake``, ``jsonl`` or ``azure``, from the first non-blank line."""
    for n, line in _lines(path):
        if not line.strip():
            continue
        head = line.lstrip("\ufeff").strip()
        if head.startswith("{"):
            return "mooncake" if '"hash_ids"' in head else "jsonl"
        if head.lower().startswith("timestamp"):
            return "azure"
        raise WorkloadError(
            f"{path.name} line {n}: not a trace (expected a JSON object per line, or the Azure CSV header "
            "TIMESTAMP,ContextTokens,GeneratedTokens)"
        )
    raise WorkloadError(f"{path.name} holds no requests")


def read_trace(path: str | Path, fmt: TraceFormat = "auto", limit: int | None = None) -> list[TraceRow]:
    """The first ``limit`` requests of a trace (all without a limit), in arrival order."""
    path = Path(path)
    if not path.exists():
        raise WorkloadError(f"trace file '{path}' does not exist")
    if not stat.S_ISREG(path.stat().st_mode):
        raise WorkloadError(f"trace file '{path}' is not a regular file (a folder, a device or a pipe)")
    kind = detect_format(path) if fmt == "auto" else fmt
    rows: list[TraceRow] = []
    last = -math.inf
    if kind == "azure":
        lines = _lines(path)
        header_n, header = next(((n, ln) for n, ln in lines if ln.strip()), (0, ""))
        cols = [c.strip().lower() for c in header.split(",")]
        want = ("timestamp", "contexttokens", "generatedtokens")
        if not all(c in cols for c in want):
            raise WorkloadError(
                f"{path.name} line {header_n}: the header must name TIMESTAMP, ContextTokens, GeneratedTokens"
            )
        idx = [cols.index(c) for c in want]
        for n, line in lines:
            if not line.strip():
                continue
            where = f"{path.name} line {n}"
            cells = next(csv.reader(io.StringIO(line)))
            if len(cells) < len(cols):
                raise WorkloadError(f"{where}: {len(cells)} cells, the header has {len(cols)}")
            t = _azure_time(cells[idx[0]], where)
            row_obj = {"in": cells[idx[1]].strip(), "out": cells[idx[2]].strip()}
            try:
                vals = {k: float(v) for k, v in row_obj.items()}
            except ValueError:
                raise WorkloadError(f"{where}: ContextTokens and GeneratedTokens must be numbers") from None
            row = TraceRow(t, _count({"v": vals["in"]}, "v", where), _count({"v": vals["out"]}, "v", where), line=n)
            last = _in_order(row, last, where)
            rows.append(row)
            if limit is not None and len(rows) >= limit:
                break
    else:
        for n, line in _lines(path):
            if not line.strip():
                continue
            where = f"{path.name} line {n}"
            row = _json_row(line, where, kind, n)
            last = _in_order(row, last, where)
            rows.append(row)
            if limit is not None and len(rows) >= limit:
                break
    if not rows:
        raise WorkloadError(f"{path.name} holds no requests")
    return rows


def _in_order(row: TraceRow, last: float, where: str) -> float:
    if row.t_s < last:
        raise WorkloadError(f"{where}: its timestamp is earlier than the line before (a trace is in arrival order)")
    if not math.isfinite(row.t_s) or (math.isfinite(last) and row.t_s - last > MAX_GAP_S):
        raise WorkloadError(
            f"{where}: {row.t_s - last:,.0f} s after the line before, over the {MAX_GAP_S:,.0f} s a trace may wait"
        )
    return row.t_s


def offsets(rows: list[TraceRow], time_scale: float = 1.0) -> list[float]:
    """Each request's due time, seconds after the first request, times ``time_scale``; a gap over
    :data:`MAX_GAP_S` once scaled is refused (a replay would wait it out)."""
    t0 = rows[0].t_s
    out = [(r.t_s - t0) * time_scale for r in rows]
    for (a, b), r in zip(itertools.pairwise(out), rows[1:], strict=True):
        if not math.isfinite(b) or b - a > MAX_GAP_S:
            raise WorkloadError(
                f"trace line {r.line}: due {b - a:,.0f} s after the request before at time scale {time_scale:g}, "
                f"over the {MAX_GAP_S:,.0f} s a replay may wait"
            )
    return out


def block_tokens(block_id: int, words: list[int], seed: int, n: int = BLOCK_TOKENS) -> list[int]:
    """The token ids of one Mooncake block: ``n`` whole-word tokens drawn from a stream seeded by
    (seed, block id), the same for every request that names the block."""
    rng = random.Random(f"trace-block:{seed}:{block_id}")
    return [rng.choice(words) for _ in range(n)]


# --- synthetic traces ------------------------------------------------------------------------


def synth(
    requests: int,
    rate: float,
    *,
    seed: int = 0,
    burstiness: float = 1.0,
    diurnal_amplitude: float = 0.0,
    diurnal_period_s: float = 60.0,
    prefix_groups: int = 4,
    prefix_blocks: int = 1,
    input_len: int = 768,
    output_len: int = 32,
    output_jitter: float = 0.5,
) -> list[dict[str, Any]]:
    """A Mooncake-format trace: arrivals of a gamma process (shape ``burstiness``, 1 = Poisson)
    at a rate that swings by ``diurnal_amplitude`` (0..1) around ``rate`` over
    ``diurnal_period_s`` (a day compressed); each request belongs to one of ``prefix_groups``
    groups (Zipf-like: group k is picked with weight 1 / (k + 1)), whose ``prefix_blocks``
    shared blocks open its ``input_len``-token prompt, the rest blocks of its own; output
    lengths vary uniformly by +-``output_jitter`` around ``output_len``."""
    blocks = math.ceil(input_len / BLOCK_TOKENS) if input_len > 0 else 0
    if requests < 1 or not rate > 0 or not 0.0 <= diurnal_amplitude < 1.0 or burstiness <= 0 or prefix_groups < 0:
        raise WorkloadError("synth needs requests >= 1, rate > 0, burstiness > 0 and 0 <= diurnal amplitude < 1")
    if prefix_groups and not 0 < prefix_blocks < blocks:
        raise WorkloadError(
            f"{prefix_blocks} shared block(s) of {BLOCK_TOKENS} tokens need a longer prompt than {input_len} tokens "
            "(each prompt ends with a block of its own)"
        )
    rng = random.Random(seed)
    weights = [1.0 / (k + 1) for k in range(prefix_groups)]
    shared_n = prefix_blocks if prefix_groups else 0
    next_block = prefix_groups * shared_n  # ids below are the groups' shared blocks
    t = 0.0
    out = []
    for _ in range(requests):
        group = rng.choices(range(prefix_groups), weights)[0] if prefix_groups else 0
        shared = list(range(group * shared_n, (group + 1) * shared_n))
        own = list(range(next_block, next_block + blocks - shared_n))
        next_block += blocks - shared_n
        n_out = max(1, round(output_len * (1 + rng.uniform(-output_jitter, output_jitter))))
        out.append(
            {"timestamp": round(t * 1000.0, 3), "input_length": input_len, "output_length": n_out,
             "hash_ids": shared + own}
        )  # fmt: skip
        now_rate = rate * (1.0 + diurnal_amplitude * math.sin(2 * math.pi * t / diurnal_period_s))
        t += rng.gammavariate(burstiness, 1.0 / (now_rate * burstiness))
    return out


def write_jsonl(rows: list[dict[str, Any]], path: str | Path) -> Path:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(r, separators=(",", ":")) + "\n" for r in rows), encoding="utf-8")
    return path


def prefix_share(rows: list[TraceRow]) -> float:
    """The share of the trace's prompt tokens in leading blocks an earlier request already sent:
    what a prefix cache can serve on it at best (a cache matches prefixes: whole leading blocks)."""
    seen: set[tuple[int, ...]] = set()
    hit = total = 0
    for r in rows:
        ids, n = r.hash_ids or (), r.input_len or 0
        total += n
        cached = 0
        for k in range(1, len(ids) + 1):
            key = ids[:k]
            if key in seen and cached == k - 1:
                cached = k
            seen.add(key)
        hit += min(cached * BLOCK_TOKENS, n)
    return hit / total if total else 0.0


def describe(rows: list[TraceRow]) -> str:
    """A few lines on what a trace holds: requests, span, rates, lengths, prefix sharing."""
    span = rows[-1].t_s - rows[0].t_s
    ins = [r.input_len for r in rows if r.input_len is not None]
    outs = [r.output_len for r in rows]
    gaps = sorted(b.t_s - a.t_s for a, b in itertools.pairwise(rows))
    lines = [
        f"requests      {len(rows)} over {span:.3f} s (mean rate {(len(rows) - 1) / span:.2f} req/s)"
        if span > 0
        else f"requests      {len(rows)}, all at once",
        f"prompt tokens mean {sum(ins) / len(ins):.0f}, max {max(ins)}" if ins else "prompt tokens (text prompts)",
        f"output tokens mean {sum(outs) / len(outs):.0f}, max {max(outs)}",
    ]
    if gaps:
        p99 = gaps[min(len(gaps) - 1, int(0.99 * len(gaps)))]
        lines.append(f"gaps          median {gaps[len(gaps) // 2] * 1000:.2f} ms, p99 {p99 * 1000:.2f} ms")
    if any(r.hash_ids for r in rows):
        lines.append(f"prefix share  {prefix_share(rows):.1%} of the prompt tokens in blocks an earlier request sent")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    import argparse
    import sys

    p = argparse.ArgumentParser(prog="python -m bench trace", description=__doc__.split("\n")[0])
    sub = p.add_subparsers(dest="command", required=True)
    s = sub.add_parser("synth", help="write a Mooncake-format trace (JSONL) of synthetic traffic")
    s.add_argument("--out", required=True, help="the trace file to write")
    s.add_argument("--requests", type=int, default=200)
    s.add_argument("--rate", type=float, default=10.0, help="mean arrival rate, req/s")
    s.add_argument(
        "--burstiness", type=float, default=1.0, help="gamma shape of the gaps: 1 = Poisson, below 1 burstier"
    )
    s.add_argument("--diurnal", type=float, default=0.0, help="rate swing around --rate, 0..1 (0: flat)")
    s.add_argument("--period", type=float, default=60.0, help="the diurnal cycle's length, s (a day compressed)")
    s.add_argument("--prefix-groups", type=int, default=4, help="groups sharing a prompt prefix (0: none)")
    s.add_argument("--prefix-blocks", type=int, default=1, help=f"shared {BLOCK_TOKENS}-token blocks per group")
    s.add_argument("--input-len", type=int, default=768, help="prompt tokens per request")
    s.add_argument("--output-len", type=int, default=32, help="mean output tokens per request")
    s.add_argument("--seed", type=int, default=0)
    i = sub.add_parser("info", help="what a trace holds: requests, span, rate, lengths, prefix sharing")
    i.add_argument("file")
    i.add_argument("--format", default="auto", choices=("auto", "mooncake", "jsonl", "azure"))
    args = p.parse_args(argv)
    try:
        if args.command == "synth":
            rows = synth(
                args.requests, args.rate, seed=args.seed, burstiness=args.burstiness, diurnal_amplitude=args.diurnal,
                diurnal_period_s=args.period, prefix_groups=args.prefix_groups, prefix_blocks=args.prefix_blocks,
                input_len=args.input_len, output_len=args.output_len,
            )  # fmt: skip
            path = write_jsonl(rows, args.out)
            print(f"wrote {path} ({len(rows)} requests, Mooncake format)")
            print(describe(read_trace(path, "mooncake")))
        else:
            print(describe(read_trace(args.file, args.format)))
    except WorkloadError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    return 0
