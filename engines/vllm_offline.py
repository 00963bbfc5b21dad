"""Worker for vLLM's offline mode: ``LLM(...).generate`` timed like ``vllm bench throughput``.

Run by :func:`engines.vllm.run_offline` with the vLLM environment's interpreter::

    python -P engines/vllm_offline.py JOB.json RESULT.json

(``-P``: otherwise this file's folder, which holds ``engines/vllm.py``, shadows the vllm package.)

``JOB.json`` holds ``engine_args`` (keyword arguments of ``vllm.LLM``), ``prompts`` (lists of
token ids), ``output_len``, ``temperature`` and ``seed``. The result holds requests/s,
output tok/s and total tok/s over the wall-clock time of the ``generate`` call (model load
excluded). This file imports only the standard library and vLLM (no MoE Bench modules), and
needs the ``__main__`` guard: vLLM spawns its engine core from here.
"""

from __future__ import annotations

import json
import sys
import time
from typing import Any


def run(job: dict[str, Any]) -> dict[str, Any]:
    """Load the model, generate once for every prompt, return the throughput figures."""
    from vllm import LLM, SamplingParams
    from vllm.inputs import TokensPrompt

    t0 = time.perf_counter()
    llm = LLM(**job["engine_args"], seed=job.get("seed", 0))
    load_seconds = time.perf_counter() - t0
    output_len = int(job["output_len"])
    params = SamplingParams(
        n=1,
        temperature=float(job.get("temperature", 0.0)),
        top_p=1.0,
        ignore_eos=True,
        max_tokens=output_len,
        min_tokens=output_len,
    )
    prompts = [TokensPrompt(prompt_token_ids=list(ids)) for ids in job["prompts"]]
    start = time.perf_counter()
    outputs = llm.generate(prompts, params, use_tqdm=False)
    elapsed = time.perf_counter() - start
    prompt_tokens = sum(len(o.prompt_token_ids or []) for o in outputs)
    output_tokens = sum(len(c.token_ids) for o in outputs for c in o.outputs)
    n = len(outputs)
    return {
        "requests": n,
        "prompt_tokens": prompt_tokens,
        "output_tokens": output_tokens,
        "elapsed_s": elapsed,
        "requests_per_s": n / elapsed,
        "output_tok_s": output_tokens / elapsed,
        "total_tok_s": (prompt_tokens + output_tokens) / elapsed,
        "load_seconds": load_seconds,
    }


def main(argv: list[str]) -> int:
    if len(argv) != 2:
        print("usage: python vllm_offline.py JOB.json RESULT.json", file=sys.stderr)
        return 2
    with open(argv[0], encoding="utf-8") as fh:
        job = json.load(fh)
    result = run(job)
    with open(argv[1], "w", encoding="utf-8") as fh:
        json.dump(result, fh)
    print("offline result:", json.dumps(result), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
