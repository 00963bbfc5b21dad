"""Prompt sources: built-in prompts, random prompts of an exact token length, JSONL files.

A workload turns into a list of :class:`engines.base.GenerationRequest`. Random
prompts are sampled token ids that decode to text which re-encodes to exactly the
requested number of tokens, so both in-process engines (which get the ids) and HTTP
servers (which get the text) see the same input length.
"""

from __future__ import annotations

import json
import random
from pathlib import Path
from typing import Any, Literal

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


class WorkloadSpec(BaseModel):
    """Which prompts to send and how long the outputs are.

    ``source``: ``builtin`` (cycled), ``random`` (exactly ``input_len`` tokens) or
    ``jsonl`` (``path``: one JSON object per line with ``prompt`` and optional
    ``output_len``).
    """

    model_config = ConfigDict(extra="forbid")

    source: Literal["builtin", "random", "jsonl"] = "random"
    input_len: int = Field(32, ge=1, le=131072, description="Prompt length in tokens (random prompts only)")
    output_len: int = Field(
        16, ge=1, le=32768, description="Tokens generated per request (max_tokens); exact when EOS is ignored"
    )
    path: str | None = None
    seed: int = Field(
        0, ge=0, le=2**31 - 1, description="Seed of the random prompts (and of sampling when temperature > 0)"
    )

    @model_validator(mode="after")
    def _path_for_jsonl(self) -> WorkloadSpec:
        if self.source == "jsonl" and not self.path:
            raise ValueError("a jsonl workload needs a path")
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


def build_requests(
    spec: WorkloadSpec,
    count: int,
    sampling: SamplingParams,
    tokenizer: Any | None,
    prefix: str = "r",
) -> list[GenerationRequest]:
    """``count`` requests from the workload; prompts are cycled when there are fewer."""
    if count < 1:
        raise WorkloadError("a run needs at least one request")
    rng = random.Random(spec.seed)
    reqs: list[GenerationRequest] = []
    if spec.source == "random":
        if tokenizer is None or not getattr(tokenizer, "supports_random_prompts", True):
            raise WorkloadError(
                "random prompts of an exact length need a local tokenizer; give the engine a model or tokenizer "
                "folder, or use built-in or JSONL prompts"
            )
        for i in range(count):
            text, ids = random_prompt(tokenizer, spec.input_len, rng)
            reqs.append(GenerationRequest(f"{prefix}{i}", text, sampling, tuple(ids), len(ids)))
        return reqs
    if spec.source == "builtin":
        items = [{"prompt": p, "output_len": None} for p in BUILTIN_PROMPTS]
    else:
        path = Path(spec.path or "")
        if not path.is_file():
            raise WorkloadError(f"prompt file '{path}' does not exist")
        items = parse_jsonl(path.read_bytes(), origin=path.name)
    for i in range(count):
        item = items[i % len(items)]
        sp = sampling
        if item.get("output_len"):
            sp = sampling.model_copy(update={"max_tokens": int(item["output_len"])})
        n_prompt = len(tokenizer(item["prompt"]).input_ids) if tokenizer is not None else None
        reqs.append(GenerationRequest(f"{prefix}{i}", item["prompt"], sp, None, n_prompt))
    return reqs
