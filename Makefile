# MoE Bench: `make run` starts the dashboard, `make test` runs the whole suite.
# Both create .venv and install what is needed first.

PYTHON ?= python3
VENV   := .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed

.PHONY: run test test-fast lint browser clean

$(STAMP): requirements.txt requirements-dev.txt
	@test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -r requirements-dev.txt
	@# PyPI's torchvision/torchaudio/torchcodec are CUDA builds that break transformers beside CPU torch.
	$(PY) -m pip uninstall -y -q torchvision torchaudio torchcodec 2>/dev/null || true
	@touch $@

run: $(STAMP)
	$(PY) -m streamlit run dashboard/app.py

# Debian's chromium for the end-to-end browser test (Playwright cannot download its own here).
browser:
	@command -v chromium >/dev/null 2>&1 || { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >/dev/null; }

test: $(STAMP) browser
	$(PY) -m ruff check engines bench dashboard tests
	$(PY) -m pytest

test-fast: $(STAMP)
	$(PY) -m pytest -m "not slow"

lint: $(STAMP)
	$(PY) -m ruff check engines bench dashboard tests

clean:
	rm -rf $(VENV) .pytest_cache tests/artifacts
