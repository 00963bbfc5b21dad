"""How a model runs: engine adapters, accelerator backends and model loading.

Nothing in this package imports streamlit; heavy packages (torch, transformers,
vllm, torch_npu, ...) are imported lazily by the module that needs them.
"""
