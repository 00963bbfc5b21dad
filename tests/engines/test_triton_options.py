"""Fast tests of the triton engine's options: only the fields it reads (no real server)."""

from __future__ import annotations

import pytest

from engines.base import create_engine, parse_options
from engines.errors import ConfigError
from engines.http_client import HTTPOptions
from engines.openai_http import OpenAIOptions
from engines.triton import TritonOptions

OPENAI_ONLY = {"endpoint", "send_min_tokens", "server_token_counts", "check_model", "async_client"}


def test_triton_options_hold_only_what_the_engine_reads() -> None:
    fields = set(TritonOptions.model_fields)
    assert not issubclass(TritonOptions, OpenAIOptions) and issubclass(TritonOptions, HTTPOptions)
    assert not fields & OPENAI_ONLY
    assert {"base_url", "tokenizer", "exact_lengths", "timeout_s", "max_connections", "model_name"} <= fields
    opts = parse_options({"kind": "triton"})
    assert opts.kind == "triton" and opts.base_url is None  # type: ignore[attr-defined]


def test_a_stored_config_with_the_old_openai_fields_still_loads() -> None:
    old = {"kind": "triton", "endpoint": "completions", "async_client": True, "check_model": True, "timeout_s": 5}
    opts = parse_options(old)
    assert isinstance(opts, TritonOptions) and opts.timeout_s == 5 and "endpoint" not in opts.model_dump()
    with pytest.raises(ConfigError, match="bogus"):
        parse_options({"kind": "triton", "bogus": 1})


def test_describe_and_body_without_openai_fields() -> None:
    from engines.base import GenerationRequest, SamplingParams

    engine = create_engine({"kind": "triton", "base_url": "http://127.0.0.1:9", "exact_lengths": False})
    info = engine.describe()
    assert info["triton_model"] == "moebench" and "endpoint" not in info
    body = engine.request_body(GenerationRequest("r", "hi", SamplingParams(max_tokens=4)))  # type: ignore[attr-defined]
    assert body == {"text_input": "hi", "max_tokens": 4, "stream": True}
