"""Model presets and loading.

Presets name real DeepSeek checkpoints (used only when present on this machine, by
local path or in the Hugging Face cache; nothing is downloaded at run time) and the
built-in ``tiny-deepseek-v3``: a DeepSeek-V3 architecture with random weights and a
locally trained byte-level BPE tokenizer, built on first use into a cache folder as a
normal HF checkpoint that transformers and vLLM can both load.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from engines.errors import ModelLoadError
from engines.settings import get_settings

TINY = "tiny-deepseek-v3"
TINY_VERSION = "2"  # bump when the tiny build changes; stale caches are rebuilt (2: <think> tokens)


@dataclass(frozen=True)
class ModelPreset:
    """A named model: built locally (``builtin``) or a real checkpoint by hub id."""

    name: str
    description: str
    hub_id: str | None = None
    builtin: bool = False
    trust_remote_code: bool = False
    random_config: dict[str, Any] | None = None  # built in memory with random weights, no checkpoint
    # built straight in the run's dtype (not float32 first, then cast): a model whose float32 copy
    # would not fit the device (the DeepSeek-V3 layer stack: 25 B parameters)
    build_in_dtype: bool = False


# DeepSeek-V2-Lite's shape in the DeepSeek-V3 architecture (FACTS.md: the H200 measurements).
V2_LITE_SHAPE: dict[str, Any] = {
    "vocab_size": 102400,
    "hidden_size": 2048,
    "intermediate_size": 10944,
    "moe_intermediate_size": 1408,
    "num_hidden_layers": 27,
    "first_k_dense_replace": 1,
    "num_attention_heads": 16,
    "num_key_value_heads": 16,
    "n_routed_experts": 64,
    "num_experts_per_tok": 6,
    "n_group": 1,
    "topk_group": 1,
    "n_shared_experts": 2,
    "routed_scaling_factor": 1.0,
    "norm_topk_prob": False,
    "q_lora_rank": None,
    "kv_lora_rank": 512,
    "qk_nope_head_dim": 128,
    "qk_rope_head_dim": 64,
    "v_head_dim": 128,
    "max_position_embeddings": 4096,
    "tie_word_embeddings": False,
}

# DeepSeek-V3's own layer shape (its config.json), cut to 3 layers: 1 dense, 2 MoE layers of 256
# experts (11.3 B parameters each): the expert-parallel study's V3 stack, about 51 GB in bf16.
V3_LAYERS_SHAPE: dict[str, Any] = {
    "vocab_size": 129280,
    "hidden_size": 7168,
    "intermediate_size": 18432,
    "moe_intermediate_size": 2048,
    "num_hidden_layers": 3,
    "first_k_dense_replace": 1,
    "num_attention_heads": 128,
    "num_key_value_heads": 128,
    "n_routed_experts": 256,
    "num_experts_per_tok": 8,
    "n_group": 8,
    "topk_group": 4,
    "n_shared_experts": 1,
    "routed_scaling_factor": 2.5,
    "norm_topk_prob": True,
    "q_lora_rank": 1536,
    "kv_lora_rank": 512,
    "qk_nope_head_dim": 128,
    "qk_rope_head_dim": 64,
    "v_head_dim": 128,
    "max_position_embeddings": 4096,
    "tie_word_embeddings": False,
}

PRESETS: dict[str, ModelPreset] = {
    p.name: p
    for p in [
        ModelPreset(TINY, "DeepSeek-V3 architecture, 1.5 M random parameters, built locally (default)", builtin=True),
        ModelPreset(
            "deepseek-v2-lite", "DeepSeek-V2-Lite, 15.7 B (2.4 B active)", hub_id="deepseek-ai/DeepSeek-V2-Lite"
        ),
        ModelPreset("deepseek-v3", "DeepSeek-V3, 671 B (37 B active)", hub_id="deepseek-ai/DeepSeek-V3"),
        ModelPreset(
            "deepseek-r1", "DeepSeek-R1 reasoning model, 671 B (37 B active)", hub_id="deepseek-ai/DeepSeek-R1"
        ),
        ModelPreset(
            "random-v2-lite-shape",
            "DeepSeek-V3 architecture shaped like DeepSeek-V2-Lite (15.7 B), random weights built in memory on "
            "the device: GPU measurements without a checkpoint (about 32 GiB in bf16)",
            random_config=V2_LITE_SHAPE,
        ),
        ModelPreset(
            "random-v3-layers",
            "DeepSeek-V3's layer shape (hidden 7168, 256 experts, top-8), 3 layers (2 MoE), random weights built on "
            "the device in its dtype: the expert-parallel study's stack (about 51 GB in bf16)",
            random_config=V3_LAYERS_SHAPE,
            build_in_dtype=True,
        ),
    ]
}

# Architecture of the tiny model: see shared FACTS.md (vLLM's MLA needs kv_lora_rank +
# qk_rope_head_dim = 576; topk_method/scoring_func must be in config.json for vLLM).
TINY_CONFIG: dict[str, Any] = {
    "vocab_size": 1024,
    "hidden_size": 128,
    "intermediate_size": 256,
    "moe_intermediate_size": 64,
    "num_hidden_layers": 3,
    "first_k_dense_replace": 1,
    "num_attention_heads": 4,
    "num_key_value_heads": 4,
    "n_routed_experts": 8,
    "num_experts_per_tok": 2,
    "n_group": 2,
    "topk_group": 1,
    "n_shared_experts": 1,
    "routed_scaling_factor": 2.5,
    "norm_topk_prob": True,
    "q_lora_rank": 48,
    "kv_lora_rank": 512,
    "qk_nope_head_dim": 32,
    "qk_rope_head_dim": 64,
    "v_head_dim": 32,
    "max_position_embeddings": 2048,
    "tie_word_embeddings": False,
}

_CORPUS_SEED_TEXT = [
    "分析以下金融数据：",
    "Mixture-of-experts models route each token to a few experts chosen by a gate.",
    "DeepSeek-V3 uses multi-head latent attention and an auxiliary-loss-free load balancing strategy.",
    "vLLM manages the KV cache in pages, so sequences share physical memory blocks.",
    "Benchmark latency, throughput and memory on CUDA, Ascend NPU, Cambricon MLU and CPU.",
    "The quick brown fox jumps over the lazy dog. 0123456789 + - * / = ( ) [ ] { } , . ; : ! ?",
    "推理性能瓶颈定位：KV Cache 访问延迟、专家路由开销、量化反量化开销、通信延迟。",
    "Explain the difference between tensor parallelism and expert parallelism in one paragraph.",
]

CHAT_TEMPLATE = (
    "{{ bos_token }}{% for message in messages %}"
    "{% if message['role'] == 'user' %}User: {{ message['content'] }}\n"
    "{% elif message['role'] == 'system' %}{{ message['content'] }}\n"
    "{% else %}Assistant: {{ message['content'] }}{{ eos_token }}\n{% endif %}"
    "{% endfor %}{% if add_generation_prompt %}Assistant:{% endif %}"
)

_build_lock = threading.Lock()


def _train_tokenizer(dest: Path) -> None:
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=TINY_CONFIG["vocab_size"] - 24,  # headroom below the model's vocab size
        special_tokens=["<pad>", "<bos>", "<eos>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    corpus = [line for _ in range(20) for line in _CORPUS_SEED_TEXT]
    tok.train_from_iterator(corpus, trainer=trainer)
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok, bos_token="<bos>", eos_token="<eos>", pad_token="<pad>", model_max_length=2048
    )
    # DeepSeek-R1's thinking markers, as R1's tokenizer has them (added, not special): vLLM's
    # deepseek_r1 reasoning parser needs both in the vocabulary (ids 615, 616: under the model's 1024)
    fast.add_tokens(["<think>", "</think>"])
    fast.chat_template = CHAT_TEMPLATE
    fast.save_pretrained(dest)


def build_tiny(dest: Path, seed: int = 0) -> Path:
    """Build the tiny DeepSeek-V3 checkpoint into ``dest`` (overwritten) and return it."""
    import torch
    from transformers import DeepseekV3Config, DeepseekV3ForCausalLM

    dest.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=".tiny-build-", dir=dest.parent))
    try:
        _train_tokenizer(tmp)
        with open(tmp / "tokenizer_config.json", encoding="utf-8") as fh:
            tok_cfg = json.load(fh)
        from transformers import AutoTokenizer

        tokenizer = AutoTokenizer.from_pretrained(tmp)
        config = DeepseekV3Config(
            **TINY_CONFIG,
            bos_token_id=tokenizer.bos_token_id,
            eos_token_id=tokenizer.eos_token_id,
            pad_token_id=tokenizer.pad_token_id,
        )
        torch.manual_seed(seed)
        model = DeepseekV3ForCausalLM(config).to(torch.float32).eval()
        model.generation_config.pad_token_id = tokenizer.pad_token_id
        model.save_pretrained(tmp, safe_serialization=True)
        cfg_path = tmp / "config.json"
        cfg = json.loads(cfg_path.read_text(encoding="utf-8"))
        cfg["topk_method"] = "noaux_tc"
        cfg["scoring_func"] = "sigmoid"
        cfg["moebench_tiny_version"] = TINY_VERSION
        cfg_path.write_text(json.dumps(cfg, indent=2), encoding="utf-8")
        del tok_cfg
        if dest.exists():
            shutil.rmtree(dest)
        os.replace(tmp, dest)
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)
    return dest


def tiny_path(cache_dir: Path | None = None) -> Path:
    """The tiny checkpoint's folder, built on first use."""
    folder = (cache_dir or get_settings().model_cache_dir) / TINY
    with _build_lock:
        cfg = folder / "config.json"
        ok = False
        if cfg.exists() and (folder / "model.safetensors").exists() and (folder / "tokenizer.json").exists():
            try:
                ok = json.loads(cfg.read_text(encoding="utf-8")).get("moebench_tiny_version") == TINY_VERSION
            except (OSError, ValueError):
                ok = False
        if not ok:
            build_tiny(folder)
    return folder


def _find_hub_snapshot(hub_id: str) -> Path | None:
    try:
        from huggingface_hub import snapshot_download

        return Path(snapshot_download(hub_id, local_files_only=True))
    except Exception:  # noqa: BLE001 - any failure means "not in the local cache"
        return None


def resolve_model(spec: str) -> tuple[str, Path]:
    """Turn a preset name or a local path into (display name, checkpoint folder).

    Raises :class:`ModelLoadError` with a one-line reason when it is not usable.
    """
    spec = (spec or "").strip()
    if not spec:
        raise ModelLoadError("no model given; pick a preset or a local checkpoint folder")
    preset = PRESETS.get(spec.lower())
    if preset is not None:
        if preset.builtin or preset.random_config is not None:  # random presets use the tiny tokenizer
            try:
                return preset.name, tiny_path()
            except Exception as exc:
                raise ModelLoadError(f"could not build {preset.name}: {type(exc).__name__}: {exc}") from exc
        local = get_settings().models_dir / preset.name
        if (local / "config.json").exists():
            return preset.name, local
        snap = _find_hub_snapshot(preset.hub_id or "")
        if snap is not None and (snap / "config.json").exists():
            return preset.name, snap
        raise ModelLoadError(
            f"model '{preset.name}' ({preset.hub_id}) is not on this machine: put the checkpoint in "
            f"{local} or the Hugging Face cache, or pass its folder as a local path"
        )
    path = Path(spec).expanduser()
    validate_checkpoint(path)
    return path.name or str(path), path.resolve()


def validate_checkpoint(path: Path) -> dict[str, Any]:
    """Check that ``path`` is a causal-LM checkpoint folder; return its config.json."""
    if not path.exists():
        known = ", ".join(PRESETS)
        raise ModelLoadError(f"model path '{path}' does not exist (and is not a preset: {known})")
    if not path.is_dir():
        raise ModelLoadError(f"model path '{path}' is a file; give the checkpoint folder")
    cfg_file = path / "config.json"
    if not cfg_file.exists():
        raise ModelLoadError(f"'{path}' has no config.json: not a Hugging Face checkpoint folder")
    try:
        cfg = json.loads(cfg_file.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise ModelLoadError(f"'{cfg_file}' is not valid JSON: {exc}") from exc
    except RecursionError as exc:
        raise ModelLoadError(f"'{cfg_file}' is JSON nested too deeply to read") from exc
    if not isinstance(cfg, dict):
        raise ModelLoadError(f"'{cfg_file}' holds a JSON {type(cfg).__name__}, not a model config object")
    archs = cfg.get("architectures") or []
    if not isinstance(archs, list):
        raise ModelLoadError(f"'{cfg_file}': 'architectures' should be a list of class names")
    if not any(str(a).endswith(("ForCausalLM", "LMHeadModel")) for a in archs):
        what = ", ".join(map(str, archs)) or f"model_type '{cfg.get('model_type', '?')}' without architectures"
        raise ModelLoadError(f"'{path}' holds a {what} config, not a causal language model")
    return cfg


def load_spec(spec: str, device: Any, dtype: Any, trust_remote_code: bool = False) -> tuple[str, Path, Any, Any]:
    """Resolve and load a preset or path: (display name, folder, model, tokenizer)."""
    name, path = resolve_model(spec)
    preset = PRESETS.get(spec.strip().lower())
    if preset is not None and preset.random_config is not None:
        return name, path, *build_random(preset.random_config, path, device, dtype, in_dtype=preset.build_in_dtype)
    return name, path, *load_model(path, device, dtype, trust_remote_code=trust_remote_code)


def build_random(
    config: dict[str, Any], tokenizer_dir: Path, device: Any, dtype: Any, in_dtype: bool = False
) -> tuple[Any, Any]:
    """A DeepSeek-V3 model from ``config`` with random weights, built directly on ``device``
    (``in_dtype``: its parameters made in ``dtype`` itself, not in float32 and then cast)."""
    try:
        import torch
        from transformers import AutoTokenizer, DeepseekV3Config, DeepseekV3ForCausalLM

        tokenizer = AutoTokenizer.from_pretrained(tokenizer_dir)
        cfg = DeepseekV3Config(
            **config,
            bos_token_id=tokenizer.bos_token_id,
            eos_token_id=tokenizer.eos_token_id,
            pad_token_id=tokenizer.pad_token_id,
        )
        torch.manual_seed(0)
        old = torch.get_default_dtype()
        try:
            if in_dtype:
                torch.set_default_dtype(dtype)
            with torch.device(device):
                model = DeepseekV3ForCausalLM(cfg).to(dtype).eval()
        finally:
            torch.set_default_dtype(old)
    except Exception as exc:
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
        raise ModelLoadError(f"could not build the random model: {type(exc).__name__}: {first}") from exc
    return model, tokenizer


def count_parameters(model: Any) -> int:
    return sum(p.numel() for p in model.parameters())


def load_model(path: Path, device: Any, dtype: Any, trust_remote_code: bool = False) -> tuple[Any, Any]:
    """Load (model, tokenizer) from a checkpoint folder onto ``device`` in ``dtype``."""
    validate_checkpoint(path)
    try:
        from transformers import AutoModelForCausalLM, AutoTokenizer

        tokenizer = AutoTokenizer.from_pretrained(path, trust_remote_code=trust_remote_code)
        model = AutoModelForCausalLM.from_pretrained(path, dtype=dtype, trust_remote_code=trust_remote_code)
    except Exception as exc:
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
        raise ModelLoadError(f"could not load '{path}': {type(exc).__name__}: {first}") from exc
    model = model.to(device).eval()
    if tokenizer.pad_token_id is None and tokenizer.eos_token_id is not None:
        tokenizer.pad_token = tokenizer.eos_token
    return model, tokenizer


_SAFETENSORS_BYTES = {"F64": 8, "F32": 4, "F16": 2, "BF16": 2, "I64": 8, "I32": 4, "I16": 2, "I8": 1, "U8": 1,
                      "BOOL": 1, "F8_E4M3": 1, "F8_E5M2": 1}  # fmt: skip
_SAFETENSORS_DTYPE = {"F64": "float64", "F32": "float32", "F16": "float16", "BF16": "bfloat16",
                      "F8_E4M3": "float8_e4m3fn", "F8_E5M2": "float8_e5m2"}  # fmt: skip


def checkpoint_stats(folder: str | Path) -> dict[str, Any] | None:
    """Parameters, weight bytes and stored dtype of a checkpoint folder, read from its
    safetensors headers (a few KB each; no tensor is loaded). ``None`` without safetensors files.

    This is how a server MoE Bench launches is described: the checkpoint it was given,
    not what the server process reports.
    """
    import struct

    files = sorted(Path(folder).glob("*.safetensors"))
    if not files:
        return None
    params = weight_bytes = 0
    dtypes: dict[str, int] = {}
    for f in files:
        try:
            with f.open("rb") as fh:
                (n,) = struct.unpack("<Q", fh.read(8))
                if n > 100 * 2**20:
                    return None  # not a safetensors header
                header = json.loads(fh.read(n))
        except (OSError, ValueError, struct.error, RecursionError):
            return None
        for name, t in header.items():
            if name == "__metadata__" or not isinstance(t, dict):
                continue
            numel = 1
            for d in t.get("shape", []):
                numel *= int(d)
            params += numel
            weight_bytes += numel * _SAFETENSORS_BYTES.get(str(t.get("dtype")), 0)
            dtypes[str(t.get("dtype"))] = dtypes.get(str(t.get("dtype")), 0) + numel
    main = max(dtypes, key=lambda k: dtypes[k]) if dtypes else None
    return {
        "parameters": params,
        "weights_gib": weight_bytes / 2**30,
        "checkpoint_dtype": _SAFETENSORS_DTYPE.get(main or "", (main or "").lower() or None),
    }


def random_weights(model: str) -> bool:
    """Whether ``model`` is a preset whose weights are random (built locally or in memory), so its
    figures measure speed, not a trained model's behaviour."""
    preset = PRESETS.get(model.strip().lower())
    return preset is not None and (preset.builtin or preset.random_config is not None)
