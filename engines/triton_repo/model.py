"""Triton Python-backend model that MoE Bench writes into its model repository.

It runs a causal LM with transformers on the configured device and streams tokens as a
*decoupled* model: one response per generated token (``text_output`` plus
``num_tokens``), then a final empty response. With ``stream`` false it sends one
response holding the whole text. Inputs follow Triton's vLLM-backend conventions
(``text_input``, ``max_tokens``, ``stream``) plus ``ignore_eos``, ``temperature``,
``top_p``. Parameters (``config.pbtxt``): ``model_dir``, ``device``, ``dtype``, ``record_routing``.

With ``record_routing`` on and a model with DeepSeek MoE gates, each request's expert routing is
counted at the gates (forward hooks; a thread-local says which request a forward belongs to)
and sent in one more response before the final one: ``expert_routing``, JSON
``{"shape": [2, layers, experts], "counts": [...]}``, tokens per (phase, MoE layer, routed
expert), phase 0 the prompt (the first forward) and 1 the generated tokens.

This file runs inside Triton's Python stub, not in MoE Bench's process; it imports only
numpy, torch, transformers and Triton's ``triton_python_backend_utils``.
"""

import json
import sys
import threading

# Filled in by MoE Bench when it writes the repository: the site-packages that hold torch
# and transformers for this server (Triton's stub does not see the caller's PYTHONPATH).
EXTRA_SYS_PATH: list = []
for _path in reversed(EXTRA_SYS_PATH):
    if _path not in sys.path:
        sys.path.insert(0, _path)

import numpy as np  # noqa: E402
import triton_python_backend_utils as pb_utils  # noqa: E402


def _scalar(request, name, default):
    tensor = pb_utils.get_input_tensor_by_name(request, name)
    if tensor is None:
        return default
    value = tensor.as_numpy().reshape(-1)[0]
    if isinstance(value, bytes):
        return value.decode("utf-8")
    if isinstance(value, np.generic):
        return value.item()
    return value


class TritonPythonModel:
    def initialize(self, args):
        import torch
        from transformers import AutoModelForCausalLM, AutoTokenizer

        config = json.loads(args["model_config"])
        params = {k: v["string_value"] for k, v in config.get("parameters", {}).items()}
        self.device = torch.device(params.get("device", "cpu"))
        dtype = getattr(torch, params.get("dtype", "float32"))
        model_dir = params["model_dir"]
        self.tokenizer = AutoTokenizer.from_pretrained(model_dir)
        self.model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=dtype).to(self.device).eval()
        self.torch = torch
        self.local = threading.local()  # .counts: the running request's [2, layers, experts] on this thread
        self.gates = []
        if params.get("record_routing", "true") == "true":
            self._hook_gates()

    def _hook_gates(self):
        """Count each request's routing at the MoE gates (modules returning top-k expert ids)."""
        cfg = self.model.config
        self.num_experts = int(getattr(cfg, "n_routed_experts", 0) or 0)
        self.top_k = int(getattr(cfg, "num_experts_per_tok", 0) or 0)
        if self.num_experts <= 0 or self.top_k <= 0:
            return
        for name, module in self.model.named_modules():
            if name.endswith("mlp.gate") and type(module).__name__.endswith(("Router", "Gate", "MoEGate")):
                module.register_forward_hook(self._make_hook(len(self.gates)))
                self.gates.append(name)

    def _make_hook(self, layer):
        def hook(module, args, output):
            counts = getattr(self.local, "counts", None)
            if counts is None:
                return
            for item in output if isinstance(output, (tuple, list)) else (output,):
                if hasattr(item, "dtype") and not item.is_floating_point() and item.shape[-1] == self.top_k:
                    flat = item.reshape(-1).to("cpu").numpy()
                    phase = 1 if self.local.seen[layer] else 0  # the first forward is the prompt's
                    self.local.seen[layer] = True
                    counts[phase, layer] += np.bincount(flat, minlength=self.num_experts)[: self.num_experts]
                    return

        return hook

    def _routing_response(self, counts):
        payload = json.dumps({"shape": list(counts.shape), "counts": counts.reshape(-1).tolist()})
        return pb_utils.InferenceResponse(
            output_tensors=[pb_utils.Tensor("expert_routing", np.array([payload.encode("utf-8")], dtype=np.object_))]
        )

    def execute(self, requests):
        for request in requests:
            threading.Thread(target=self._serve, args=(request,), daemon=True).start()
        return None

    def _serve(self, request):
        sender = request.get_response_sender()
        try:
            self._generate(request, sender)
        except Exception as exc:  # noqa: BLE001 - every failure goes back to the client as this request's error
            error = pb_utils.TritonError(f"{type(exc).__name__}: {exc}")
            sender.send(pb_utils.InferenceResponse(error=error), flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)

    def _response(self, text, tokens):
        return pb_utils.InferenceResponse(
            output_tensors=[
                pb_utils.Tensor("text_output", np.array([text.encode("utf-8")], dtype=np.object_)),
                pb_utils.Tensor("num_tokens", np.array([tokens], dtype=np.int32)),
            ]
        )

    def _generate(self, request, sender):
        import queue

        from transformers.generation.streamers import BaseStreamer

        torch = self.torch
        prompt = _scalar(request, "text_input", "")
        max_tokens = int(_scalar(request, "max_tokens", 16))
        stream = bool(_scalar(request, "stream", True))
        ignore_eos = bool(_scalar(request, "ignore_eos", False))
        temperature = float(_scalar(request, "temperature", 0.0))
        top_p = float(_scalar(request, "top_p", 1.0))
        if not prompt:
            raise ValueError("text_input is empty")
        if max_tokens < 1:
            raise ValueError("max_tokens must be at least 1")
        ids = self.tokenizer(prompt, return_tensors="pt").input_ids.to(self.device)
        out_q = queue.Queue()
        end = object()

        class Streamer(BaseStreamer):
            def __init__(self):
                self.prompt_seen = False

            def put(self, value):
                if not self.prompt_seen:
                    self.prompt_seen = True
                    return
                out_q.put(value.reshape(-1).tolist())

            def end(self):
                out_q.put(end)

        kwargs = {
            "input_ids": ids,
            "attention_mask": torch.ones_like(ids),
            "max_new_tokens": max_tokens,
            "streamer": Streamer(),
            "pad_token_id": self.tokenizer.pad_token_id,
        }
        if ignore_eos:
            kwargs["min_new_tokens"] = max_tokens
        if temperature > 0:
            kwargs.update(do_sample=True, temperature=temperature, top_p=top_p, top_k=0)
        else:
            kwargs.update(do_sample=False, temperature=None, top_p=None, top_k=None)
        errors = []
        counts = np.zeros((2, len(self.gates), getattr(self, "num_experts", 0)), dtype=np.int64) if self.gates else None

        def run():
            self.local.counts = counts  # the gates' hooks run on this thread: they count for this request
            self.local.seen = [False] * len(self.gates)
            try:
                with torch.inference_mode():
                    self.model.generate(**kwargs)
            except Exception as exc:  # noqa: BLE001 - handed to the sending thread
                errors.append(exc)
                out_q.put(end)
            finally:
                self.local.counts = None

        worker = threading.Thread(target=run, daemon=True)
        worker.start()
        generated, emitted = [], ""
        while True:
            item = out_q.get()
            if item is end:
                break
            generated.extend(item)
            text = self.tokenizer.decode(generated, skip_special_tokens=True)
            delta = "" if text.endswith("\ufffd") else text[len(emitted) :]
            emitted += delta
            if stream:
                sender.send(self._response(delta, len(item)))
        worker.join()
        if errors:
            raise errors[0]
        if not stream:
            sender.send(self._response(emitted, len(generated)))
        if counts is not None:
            sender.send(self._routing_response(counts))
        sender.send(flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)

    def finalize(self):
        self.model = None
