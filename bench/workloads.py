"""Prompt sources: built-in, random of exact token lengths, JSONL and ShareGPT files,
shared-prefix groups and multi-turn chat sessions.

A workload turns into a list of :class:`engines.base.GenerationRequest`. Random
prompts are sampled token ids that decode to text which re-encodes to exactly the
requested number of tokens, so both in-process engines (which get the ids) and HTTP
servers (which get the text) see the same input length. Shared-prefix and multi-turn
prompts are built from such pieces and checked to re-encode exactly as a whole.
"""

from __future__ import annotations

import json
import random
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, Literal, get_args

from pydantic import BaseModel, ConfigDict, Field, model_validator

from engines.base import GenerationRequest, SamplingParams
from engines.errors import WorkloadError

SEED_PROMPT = "分析以下金融数据："  # the prompt of the seed chapter's 8.2.3 example

BUILTIN_PROMPTS: tuple[str, ...] = (
    SEED_PROMPT,
    "Explain how a mixture-of-experts layer routes each token to its experts.",
    "Summarize the benefits of paged KV cache management for LLM serving.",
    "List three bottlenecks of native inference for DeepSeek MoE models.",
    "推理性能瓶颈定位：请说明 KV Cache 访问延迟的原因。",
    "Write a short note comparing tensor parallelism and expert parallelism.",
    "What limits decode throughput on a memory-bandwidth-bound accelerator?",
    "Describe how FP8 quantization changes the memory footprint of a model.",
)

MAX_JSONL_BYTES = 50 * 1024 * 1024
# ShareGPT_V3_unfiltered_cleaned_split.json, the file vllm bench uses, is about 640 MiB.
MAX_SHAREGPT_BYTES = 1024 * 1024 * 1024
SHAREGPT_MIN_TOKENS = 4  # vllm bench's floor for a prompt and a reply

WorkloadSource = Literal["random", "builtin", "jsonl", "sharegpt", "shared_prefix", "multi_turn"]
WORKLOAD_SOURCES: tuple[str, ...] = get_args(WorkloadSource)
LengthDist = Literal["fixed", "uniform", "normal"]
LENGTH_DISTS: tuple[str, ...] = get_args(LengthDist)

MAX_INPUT_LEN = 131072
MAX_OUTPUT_LEN = 32768

# Turn markers of multi-turn prompts; each turn's prompt ends with the assistant marker.
USER_MARKER = "User:"
NEXT_USER_MARKER = "\nUser:"
ASSISTANT_MARKER = "\nAssistant:"


class WorkloadSpec(BaseModel):
    """Which prompts to send and how long the outputs are.

    ``source``: ``random`` (exactly ``input_len`` tokens), ``builtin`` (cycled),
    ``jsonl`` (``path``: one JSON object per line with ``prompt`` and optional
    ``output_len``), ``sharegpt`` (``path``: a ShareGPT JSON file, as vllm bench reads
    it), ``shared_prefix`` (``prefix_groups`` random prefixes of ``prefix_len`` tokens,
    each request one of them plus a random suffix) or ``multi_turn`` (``sessions`` chats
    of ``turns`` turns, each turn resending the history). Random, shared-prefix and
    multi-turn lengths can vary per request (``input_dist`` / ``output_dist``); the
    other sources ignore those fields.
    """

    model_config = ConfigDict(extra="forbid")

    source: WorkloadSource = "random"
    input_len: int = Field(
        32,
        ge=1,
        le=MAX_INPUT_LEN,
        description="Prompt length in tokens (random prompts; the suffix of shared_prefix, each user turn of "
        "multi_turn); the mean when input_dist is normal",
    )
    output_len: int = Field(
        16,
        ge=1,
        le=MAX_OUTPUT_LEN,
        description="Tokens generated per request (max_tokens); exact when EOS is ignored; the mean when "
        "output_dist is normal",
    )
    path: str | None = None
    seed: int = Field(
        0, ge=0, le=2**31 - 1, description="Seed of the random prompts (and of sampling when temperature > 0)"
    )
    input_dist: LengthDist = Field(
        "fixed",
        description="How prompt lengths vary per request: fixed (input_len), uniform (input_min..input_max) or "
        "normal (mean input_len, input_std, clipped to input_min..input_max)",
    )
    input_min: int | None = Field(
        None, ge=1, le=MAX_INPUT_LEN, description="Shortest drawn prompt (uniform: needed; normal: default 1)"
    )
    input_max: int | None = Field(
        None,
        ge=1,
        le=MAX_INPUT_LEN,
        description=f"Longest drawn prompt (uniform: needed; normal: default {MAX_INPUT_LEN})",
    )
    input_std: float | None = Field(
        None, ge=0.0, le=MAX_INPUT_LEN, description="Standard deviation of normal prompt lengths, in tokens"
    )
    output_dist: LengthDist = Field(
        "fixed",
        description="How output lengths vary per request: fixed (output_len), uniform (output_min..output_max) "
        "or normal (mean output_len, output_std, clipped to output_min..output_max)",
    )
    output_min: int | None = Field(
        None, ge=1, le=MAX_OUTPUT_LEN, description="Shortest drawn output (uniform: needed; normal: default 1)"
    )
    output_max: int | None = Field(
        None,
        ge=1,
        le=MAX_OUTPUT_LEN,
        description=f"Longest drawn output (uniform: needed; normal: default {MAX_OUTPUT_LEN})",
    )
    output_std: float | None = Field(
        None, ge=0.0, le=MAX_OUTPUT_LEN, description="Standard deviation of normal output lengths, in tokens"
    )
    sharegpt_output_len: Literal["dataset", "fixed"] = Field(
        "dataset",
        description="ShareGPT output lengths: each reply's token count (dataset) or output_len for all (fixed)",
    )
    sharegpt_max_len: int = Field(
        2048,
        ge=2 * SHAREGPT_MIN_TOKENS,
        le=MAX_INPUT_LEN + MAX_OUTPUT_LEN,
        description="ShareGPT: skip conversations whose prompt + output exceed this many tokens",
    )
    prefix_groups: int = Field(
        10, ge=1, le=100_000, description="Shared-prefix groups, each with its own random prefix (round-robin)"
    )
    prefix_len: int = Field(
        256, ge=1, le=MAX_INPUT_LEN, description="Tokens of each shared prefix (before the input_len suffix)"
    )
    sessions: int = Field(4, ge=1, le=100_000, description="Multi-turn: chat sessions (per round of turns)")
    turns: int = Field(3, ge=1, le=1000, description="Multi-turn: turns per session; each resends the history")

    @model_validator(mode="after")
    def _path_for_jsonl(self) -> WorkloadSpec:
        if self.source in ("jsonl", "sharegpt") and not self.path:
            raise ValueError(f"a {self.source} workload needs a path")
        return self

    @model_validator(mode="after")
    def _length_bounds(self) -> WorkloadSpec:
        for side in ("input", "output"):
            dist = getattr(self, f"{side}_dist")
            lo, hi = getattr(self, f"{side}_min"), getattr(self, f"{side}_max")
            if lo is not None and hi is not None and lo > hi:
                raise ValueError(f"{side}_min ({lo}) is above {side}_max ({hi})")
            if dist == "uniform" and (lo is None or hi is None):
                raise ValueError(f"a uniform {side} length needs {side}_min and {side}_max")
            if dist == "normal" and getattr(self, f"{side}_std") is None:
                raise ValueError(f"a normal {side} length needs {side}_std")
        return self


def parse_jsonl(data: bytes | str, origin: str = "upload") -> list[dict[str, Any]]:
    """Validate JSONL prompts; raise :class:`WorkloadError` naming the first bad line."""
    if isinstance(data, bytes):
        if len(data) > MAX_JSONL_BYTES:
            raise WorkloadError(f"{origin} is larger than {MAX_JSONL_BYTES // 2**20} MiB")
        try:
            data = data.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise WorkloadError(f"{origin} is not UTF-8 text (byte {exc.start})") from exc
    items: list[dict[str, Any]] = []
    for n, line in enumerate(data.splitlines(), start=1):
        if not line.strip():
            continue
        try:
            obj = json.loads(line)
        except json.JSONDecodeError as exc:
            raise WorkloadError(f"{origin} line {n}: not valid JSON ({exc.msg})") from exc
        if not isinstance(obj, dict):
            raise WorkloadError(f"{origin} line {n}: expected an object with a 'prompt' field")
        prompt = obj.get("prompt")
        if not isinstance(prompt, str) or not prompt.strip():
            raise WorkloadError(f"{origin} line {n}: 'prompt' must be a non-empty string")
        out_len = obj.get("output_len")
        if out_len is not None and (not isinstance(out_len, int) or isinstance(out_len, bool) or out_len < 1):
            raise WorkloadError(f"{origin} line {n}: 'output_len' must be a positive integer")
        items.append({"prompt": prompt, "output_len": out_len})
    if not items:
        raise WorkloadError(f"{origin} holds no prompts")
    return items


def _special_ids(tokenizer: Any) -> set[int]:
    return set(getattr(tokenizer, "all_special_ids", []) or [])


_WORD_TOKENS: dict[int, list[int]] = {}


def _word_tokens(tokenizer: Any) -> list[int]:
    """Ids of whole-word tokens (" word") that encode back to themselves alone.

    A sequence of such tokens decodes to space-separated words that a byte-level or
    whitespace pre-tokenizer splits at the same places, so it re-encodes exactly.
    """
    key = id(tokenizer)
    if key not in _WORD_TOKENS:
        special = _special_ids(tokenizer)
        out = []
        for i in range(len(tokenizer)):
            if i in special:
                continue
            text = tokenizer.decode([i])
            if len(text) > 1 and text[0] == " " and text[1:].isalnum():
                if tokenizer.encode(text, add_special_tokens=False) == [i]:
                    out.append(i)
        _WORD_TOKENS[key] = out
    return _WORD_TOKENS[key]


def random_prompt(tokenizer: Any, length: int, rng: random.Random) -> tuple[str, list[int]]:
    """Text that the tokenizer encodes (without special tokens) to exactly ``length`` ids."""
    words = _word_tokens(tokenizer)
    if len(words) >= 8:
        ids = [rng.choice(words) for _ in range(length)]
        text = tokenizer.decode(ids)
        if tokenizer.encode(text, add_special_tokens=False) == ids:
            return text, ids
    special = _special_ids(tokenizer)
    candidates = [i for i in range(len(tokenizer)) if i not in special]
    ids = [rng.choice(candidates) for _ in range(length)]
    for _ in range(50):  # decode / re-encode / adjust, as vLLM's random dataset does
        text = tokenizer.decode(ids, skip_special_tokens=True)
        re_ids = tokenizer.encode(text, add_special_tokens=False)
        if len(re_ids) == length:
            return text, re_ids
        if len(re_ids) > length:
            ids = re_ids[:length]
        else:
            ids = re_ids + [rng.choice(candidates) for _ in range(length - len(re_ids))]
    raise WorkloadError(f"could not build a prompt of exactly {length} tokens with this tokenizer")


_HUMAN = frozenset({"human", "user"})  # ShareGPT's "from" values of a prompt turn
_GPT = frozenset({"gpt", "chatgpt", "assistant"})  # ... and of a reply turn


def parse_sharegpt(data: bytes | str, origin: str = "upload") -> list[tuple[str, str]]:
    """(prompt, reply) pairs of a ShareGPT JSON file, in file order.

    Each entry's first ``human`` turn is the prompt and the turn right after it, when
    it is a ``gpt`` turn, the reply. Entries with fewer than 2 turns or without such a
    pair are skipped; a file with none raises :class:`WorkloadError`.
    """
    if isinstance(data, bytes):
        if len(data) > MAX_SHAREGPT_BYTES:
            raise WorkloadError(f"{origin} is larger than {MAX_SHAREGPT_BYTES // 2**20} MiB")
        try:
            data = data.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise WorkloadError(f"{origin} is not UTF-8 text (byte {exc.start})") from exc
    try:
        obj = json.loads(data)
    except json.JSONDecodeError as exc:
        raise WorkloadError(f"{origin} is not valid JSON ({exc.msg} at line {exc.lineno})") from exc
    if not isinstance(obj, list):
        raise WorkloadError(f"{origin} is not a ShareGPT file: expected a JSON list of conversations")
    pairs: list[tuple[str, str]] = []
    for entry in obj:
        turns = entry.get("conversations") if isinstance(entry, dict) else None
        if not isinstance(turns, list) or len(turns) < 2:
            continue
        for k, turn in enumerate(turns[:-1]):
            if _turn_from(turn) in _HUMAN:
                reply = turns[k + 1]
                if _turn_from(reply) in _GPT and isinstance(turn.get("value"), str):
                    if isinstance(reply.get("value"), str):
                        pairs.append((turn["value"], reply["value"]))
                break
    if not pairs:
        raise WorkloadError(f"{origin} holds no conversation with a human turn followed by a gpt reply")
    return pairs


def _turn_from(turn: Any) -> str | None:
    return turn.get("from") if isinstance(turn, dict) else None


def draw_lengths(
    dist: str, base: int, lo: int | None, hi: int | None, std: float | None, cap: int, n: int, rng: random.Random
) -> list[int]:
    """``n`` lengths: ``base`` each (fixed), uniform over ``lo..hi``, or normal(``base``, ``std``)
    rounded and clipped to ``lo..hi`` (unset bounds: 1 and ``cap``)."""
    if dist == "fixed":
        return [base] * n
    low, high = lo or 1, hi or cap
    if dist == "uniform":
        return [rng.randint(low, high) for _ in range(n)]
    if dist == "normal":
        sd = std or 0.0
        return [min(high, max(low, round(rng.gauss(base, sd)))) for _ in range(n)]
    raise WorkloadError(f"unknown length distribution '{dist}'; known: {', '.join(LENGTH_DISTS)}")


def _input_lengths(spec: WorkloadSpec, n: int) -> list[int]:
    # Lengths have their own seeded streams, so a fixed distribution draws nothing and
    # the prompts of existing runs stay what they were.
    rng = random.Random(f"input-lengths:{spec.seed}")
    return draw_lengths(
        spec.input_dist, spec.input_len, spec.input_min, spec.input_max, spec.input_std, MAX_INPUT_LEN, n, rng
    )


def _output_lengths(spec: WorkloadSpec, n: int, sampling: SamplingParams) -> list[int] | None:
    """Drawn output lengths, or ``None`` for a fixed distribution (``sampling`` is used as is)."""
    if spec.output_dist == "fixed":
        return None
    rng = random.Random(f"output-lengths:{spec.seed}")
    return draw_lengths(
        spec.output_dist, spec.output_len, spec.output_min, spec.output_max, spec.output_std, MAX_OUTPUT_LEN, n, rng
    )


class _SamplingFor:
    """``sampling`` with ``max_tokens`` replaced, one copy per distinct length."""

    def __init__(self, sampling: SamplingParams) -> None:
        self.sampling = sampling
        self._copies: dict[int, SamplingParams] = {}

    def __call__(self, max_tokens: int | None) -> SamplingParams:
        if max_tokens is None or max_tokens == self.sampling.max_tokens:
            return self.sampling
        if max_tokens not in self._copies:
            self._copies[max_tokens] = self.sampling.model_copy(update={"max_tokens": max_tokens})
        return self._copies[max_tokens]


Piece = tuple[str, list[int]]  # a text and the ids it encodes to


def _encode_many(tokenizer: Any, texts: list[str]) -> list[list[int]]:
    """``encode`` of each text; a fast (Rust) tokenizer encodes the batch on all cores."""
    if len(texts) > 1 and getattr(tokenizer, "is_fast", False):
        return [list(ids) for ids in tokenizer(texts, add_special_tokens=False)["input_ids"]]
    return [tokenizer.encode(t, add_special_tokens=False) for t in texts]


_COMPOSE_TRIES = 20


def _compose_all(
    tokenizer: Any, indices: Sequence[int], draw: Callable[[int], list[Piece]], failure: Callable[[int], str]
) -> dict[int, Piece]:
    """For each index, ``draw(index)``'s pieces joined, checked to re-encode to exactly their ids.

    Joining two exact pieces may not be exact (a token can merge across the boundary),
    so an index whose join fails is drawn again, up to a few times, then
    :class:`WorkloadError` (``failure(index)``). ``draw`` must be random per call.
    """
    out: dict[int, Piece] = {}
    pending = list(indices)
    for _ in range(_COMPOSE_TRIES):
        joined: list[tuple[int, Piece]] = []
        for i in pending:
            pieces = draw(i)
            joined.append((i, ("".join(t for t, _ in pieces), [x for _, ids in pieces for x in ids])))
        encoded = _encode_many(tokenizer, [text for _, (text, _) in joined])
        pending = []
        for (i, piece), ids in zip(joined, encoded, strict=True):
            if ids == piece[1]:
                out[i] = piece
            else:
                pending.append(i)
        if not pending:
            return out
    raise WorkloadError(failure(pending[0]))


def _need_local_tokenizer(tokenizer: Any, what: str) -> None:
    if tokenizer is None or not getattr(tokenizer, "supports_random_prompts", True):
        raise WorkloadError(
            f"{what} of an exact length need a local tokenizer; give the engine a model or tokenizer "
            "folder, or use built-in or JSONL prompts"
        )


def multi_turn_position(spec: WorkloadSpec, index: int) -> tuple[int, int]:
    """(session, turn) of request ``index`` of a multi-turn workload, both from 0.

    Requests are turn-major: all sessions' turn 0, then turn 1, ...; past
    ``sessions * turns`` requests a new round of sessions starts (numbered on).
    """
    rounds, within = divmod(index, spec.sessions * spec.turns)
    turn, session = divmod(within, spec.sessions)
    return rounds * spec.sessions + session, turn


def build_requests(
    spec: WorkloadSpec,
    count: int,
    sampling: SamplingParams,
    tokenizer: Any | None,
    prefix: str = "r",
) -> list[GenerationRequest]:
    """``count`` requests from the workload, ids ``{prefix}0`` .. ``{prefix}{count-1}``.

    Built-in, JSONL and ShareGPT prompts are cycled when there are fewer than
    ``count``; multi-turn workloads are cut or run further rounds of new sessions
    (see :func:`multi_turn_position`).
    """
    if count < 1:
        raise WorkloadError("a run needs at least one request")
    if spec.source == "random":
        return _random_requests(spec, count, sampling, tokenizer, prefix)
    if spec.source == "shared_prefix":
        return _shared_prefix_requests(spec, count, sampling, tokenizer, prefix)
    if spec.source == "multi_turn":
        return _multi_turn_requests(spec, count, sampling, tokenizer, prefix)
    if spec.source == "sharegpt":
        return _sharegpt_requests(spec, count, sampling, tokenizer, prefix)
    if spec.source == "builtin":
        items = [{"prompt": p, "output_len": None} for p in BUILTIN_PROMPTS]
    else:
        path = _existing_file(spec.path, "prompt file")
        items = parse_jsonl(path.read_bytes(), origin=path.name)
    reqs: list[GenerationRequest] = []
    for i in range(count):
        item = items[i % len(items)]
        sp = sampling
        if item.get("output_len"):
            sp = sampling.model_copy(update={"max_tokens": int(item["output_len"])})
        n_prompt = len(tokenizer(item["prompt"]).input_ids) if tokenizer is not None else None
        reqs.append(GenerationRequest(f"{prefix}{i}", item["prompt"], sp, None, n_prompt))
    return reqs


def _random_requests(
    spec: WorkloadSpec, count: int, sampling: SamplingParams, tokenizer: Any, prefix: str
) -> list[GenerationRequest]:
    _need_local_tokenizer(tokenizer, "random prompts")
    rng = random.Random(spec.seed)
    in_lens, out_lens, sp = _input_lengths(spec, count), _output_lengths(spec, count, sampling), _SamplingFor(sampling)
    reqs: list[GenerationRequest] = []
    for i in range(count):
        text, ids = random_prompt(tokenizer, in_lens[i], rng)
        reqs.append(
            GenerationRequest(f"{prefix}{i}", text, sp(out_lens[i] if out_lens else None), tuple(ids), len(ids))
        )
    return reqs


def _shared_prefix_requests(
    spec: WorkloadSpec, count: int, sampling: SamplingParams, tokenizer: Any, prefix: str
) -> list[GenerationRequest]:
    """Request ``i`` is group ``i % prefix_groups``'s prefix followed by its own random suffix."""
    _need_local_tokenizer(tokenizer, "shared-prefix prompts")
    rng = random.Random(spec.seed)
    prefixes = [random_prompt(tokenizer, spec.prefix_len, rng) for _ in range(spec.prefix_groups)]
    in_lens, out_lens, sp = _input_lengths(spec, count), _output_lengths(spec, count, sampling), _SamplingFor(sampling)
    prompts = _compose_all(
        tokenizer,
        range(count),
        lambda i: [prefixes[i % spec.prefix_groups], random_prompt(tokenizer, in_lens[i], rng)],
        lambda i: (
            f"could not build a shared-prefix prompt of exactly {spec.prefix_len} + {in_lens[i]} tokens "
            "with this tokenizer"
        ),
    )
    reqs: list[GenerationRequest] = []
    for i in range(count):
        text, ids = prompts[i]
        reqs.append(
            GenerationRequest(f"{prefix}{i}", text, sp(out_lens[i] if out_lens else None), tuple(ids), len(ids))
        )
    return reqs


def _multi_turn_requests(
    spec: WorkloadSpec, count: int, sampling: SamplingParams, tokenizer: Any, prefix: str
) -> list[GenerationRequest]:
    """Chat sessions whose every turn resends the whole history so far.

    A turn's prompt is ``User: <u1>\\nAssistant: <a1>\\nUser: <u2>\\nAssistant:``: earlier
    user turns (``input_len`` random tokens each) and *synthetic* assistant replies of
    that turn's output length (random tokens: the model's real replies are not known
    when the requests are built, so the history is not what the model said). Requests
    are turn-major, so in a closed loop a session's turn is sent after its earlier
    turns were; ``count`` below ``sessions * turns`` drops the last turns, above it
    starts further rounds of new sessions.
    """
    _need_local_tokenizer(tokenizer, "multi-turn prompts")
    rng = random.Random(spec.seed)
    user0, user, assistant = (
        (m, tokenizer.encode(m, add_special_tokens=False)) for m in (USER_MARKER, NEXT_USER_MARKER, ASSISTANT_MARKER)
    )
    in_lens, out_lens, sp = _input_lengths(spec, count), _output_lengths(spec, count, sampling), _SamplingFor(sampling)
    history: dict[int, Piece] = {}  # session -> its last prompt + synthetic reply
    positions = [multi_turn_position(spec, i) for i in range(count)]

    def draw(i: int) -> list[Piece]:
        session, turn = positions[i]
        if turn == 0:
            return [user0, random_prompt(tokenizer, in_lens[i], rng), assistant]
        return [history[session], user, random_prompt(tokenizer, in_lens[i], rng), assistant]

    def failure(i: int) -> str:
        session, turn = positions[i]
        return f"could not build a multi-turn prompt (session {session}, turn {turn}) that re-encodes exactly"

    reqs: list[GenerationRequest] = []
    for start in range(0, count, spec.sessions):  # one turn of ``sessions`` sessions at a time
        rows = range(start, min(start + spec.sessions, count))
        prompts = _compose_all(tokenizer, rows, draw, failure)
        for i in rows:
            session, turn = positions[i]
            text, ids = prompts[i]
            max_tokens = out_lens[i] if out_lens else sampling.max_tokens
            reqs.append(GenerationRequest(f"{prefix}{i}", text, sp(max_tokens), tuple(ids), len(ids)))
            history.pop(session, None)
            if turn + 1 < spec.turns:
                reply_text, reply_ids = random_prompt(tokenizer, max_tokens, rng)
                history[session] = (text + reply_text, ids + reply_ids)
    return reqs


def _existing_file(raw: str | None, what: str) -> Path:
    """``raw`` as a path to a regular file, or a one-line :class:`WorkloadError` saying what it is instead."""
    path = Path(raw or "")
    if path.is_dir():
        raise WorkloadError(f"{what} '{path}' is a folder, not a file")
    if not path.is_file():
        raise WorkloadError(f"{what} '{path}' does not exist")
    return path


def _sharegpt_requests(
    spec: WorkloadSpec, count: int, sampling: SamplingParams, tokenizer: Any, prefix: str
) -> list[GenerationRequest]:
    """ShareGPT prompts in a seeded shuffle, as vllm bench samples them (cycled when short).

    The output length is the reply's token count (``sharegpt_output_len="dataset"``)
    or ``sampling.max_tokens``. Pairs with a prompt or a dataset reply under 4 tokens,
    or prompt + output above ``sharegpt_max_len`` tokens, are skipped.
    """
    if tokenizer is None:
        raise WorkloadError("ShareGPT prompts need a tokenizer to measure their lengths; give the engine one")
    path = _existing_file(spec.path, "ShareGPT file")
    if path.stat().st_size > MAX_SHAREGPT_BYTES:
        raise WorkloadError(f"{path.name} is larger than {MAX_SHAREGPT_BYTES // 2**20} MiB")
    pairs = parse_sharegpt(path.read_bytes(), origin=path.name)
    order = list(range(len(pairs)))
    random.Random(spec.seed).shuffle(order)
    fixed = spec.sharegpt_output_len == "fixed"
    items: list[tuple[str, int, int]] = []  # prompt, its token count, output length
    for k in order:
        prompt, reply = pairs[k]
        n_prompt = len(tokenizer(prompt).input_ids)
        n_out = sampling.max_tokens if fixed else len(tokenizer.encode(reply, add_special_tokens=False))
        if n_prompt < SHAREGPT_MIN_TOKENS or n_out < SHAREGPT_MIN_TOKENS or n_prompt + n_out > spec.sharegpt_max_len:
            continue
        items.append((prompt, n_prompt, n_out))
        if len(items) == count:
            break
    if not items:
        raise WorkloadError(
            f"{path.name} has no usable conversation: prompts and replies need {SHAREGPT_MIN_TOKENS}+ tokens and "
            f"prompt + output at most {spec.sharegpt_max_len} tokens"
        )
    sp = _SamplingFor(sampling)
    reqs: list[GenerationRequest] = []
    for i in range(count):
        prompt, n_prompt, n_out = items[i % len(items)]
        reqs.append(GenerationRequest(f"{prefix}{i}", prompt, sp(n_out), None, n_prompt))
    return reqs
