"""Token counting on the client: a tokenizer's count of text, the running count of one
stream (:class:`TextCounter`), and a server's ``/tokenize`` standing in for a local tokenizer.

Engines use these where the server does not say how many tokens a chunk holds; the
recorder uses :func:`count_tokens` to recount a request's text.
"""

from __future__ import annotations

from typing import Any

from engines.errors import RequestFailed
from engines.http_errors import http_get

SERVER_TOKENIZER = "server"  # options.tokenizer value: use the server's /tokenize


class ServerTokenizer:
    """The server's ``/tokenize`` and ``/detokenize`` (vLLM, SGLang) behind the few tokenizer
    calls MoE Bench makes: counting tokens of prompts and streamed text. It has no vocabulary
    to sample from, so random exact-length prompts still need a local tokenizer."""

    supports_random_prompts = False

    def __init__(self, client: Any, root: str, model: str) -> None:
        self.client, self.root, self.model = client, root, model
        self.all_special_ids: list[int] = []

    def available(self) -> bool:
        try:
            return bool(self.encode("hello"))
        except Exception:  # noqa: BLE001 - no such endpoint, or not this format
            return False

    def encode(self, text: str, add_special_tokens: bool = False) -> list[int]:
        body = {"model": self.model, "prompt": text, "add_special_tokens": add_special_tokens}
        resp = http_get(self.client, f"{self.root}/tokenize", method="POST", json=body, timeout=30.0)
        if resp.status_code != 200:
            raise RequestFailed(f"HTTP {resp.status_code} from {self.root}/tokenize")
        return list(resp.json()["tokens"])

    def decode(self, ids: list[int], skip_special_tokens: bool = True) -> str:
        body = {"model": self.model, "tokens": list(ids)}
        resp = http_get(self.client, f"{self.root}/detokenize", method="POST", json=body, timeout=30.0)
        if resp.status_code != 200:
            raise RequestFailed(f"HTTP {resp.status_code} from {self.root}/detokenize")
        return str(resp.json()["prompt"])

    def __call__(self, text: str, add_special_tokens: bool = True) -> Any:
        from types import SimpleNamespace

        return SimpleNamespace(input_ids=self.encode(text, add_special_tokens=add_special_tokens))


def count_tokens(tokenizer: Any, text: str) -> int:
    """Tokens in ``text`` (no special tokens added), through a Hugging Face fast tokenizer's
    Rust core when it has one (skipping the Python wrapper's per-call cost)."""
    if not text:
        return 0
    core = getattr(tokenizer, "backend_tokenizer", None)
    if core is not None:
        return len(core.encode(text, add_special_tokens=False).ids)
    return len(tokenizer.encode(text, add_special_tokens=False))


class TextCounter:
    """Client-side token counts of one stream: the growth of the token count of all text so far.

    Counting the whole text (not each delta alone) avoids counting a multi-byte character
    split across chunks twice; a chunk that stands for a token counts at least one, and a
    later chunk gives back what such floors over-counted. The text's token count is kept
    up to date from the growth over the last ``TAIL`` characters plus the delta, not by
    re-encoding the whole text (which made a long stream quadratic): tokenizers split on
    word boundaries, so the local growth is the global one. Exact only when the text
    re-tokenizes as generated: the server's ``usage`` stays the reference.
    """

    TAIL = 64

    def __init__(self, tokenizer: Any) -> None:
        self.tokenizer = tokenizer
        self.tail = ""
        self.tail_tokens = 0  # tokens in self.tail
        self.total = 0  # tokens in all text so far
        self.counted = 0

    def _len(self, text: str) -> int:
        return count_tokens(self.tokenizer, text)

    def add(self, delta: str, carries_token: bool) -> int:
        floor = 1 if (delta or carries_token) else 0
        # U+FFFD stands for bytes the server could not decode (a byte token of a split or
        # invalid character): it says nothing about the token count, so it is left out.
        clean = delta.replace("\ufffd", "")
        if self.tokenizer is None or not clean:
            n = floor
        else:
            grown = self.tail + clean
            grown_tokens = self._len(grown)
            self.total += grown_tokens - self.tail_tokens
            if len(grown) > 2 * self.TAIL:  # one extra encode every TAIL characters or so
                self.tail = grown[-self.TAIL :]
                self.tail_tokens = self._len(self.tail)
            else:
                self.tail, self.tail_tokens = grown, grown_tokens
            n = max(self.total - self.counted, floor)
        self.counted += n
        return n
