# Two commands do all the setup on a fresh Linux box with Python >= 3.11 and the package registries:
#   make demo   -- creates .venv if missing, builds a small dataset offline, trains on the laptop CPU
#   make test   -- creates .venv if missing, installs the dev, parity, tpu and gcs-test extras, runs
#                  the default test tier
#   make test-slow -- also installs the zoo extra (transformers, segment-anything), runs the slow tier
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
# The PyTorch reference only needs a CPU build. On this project's CI machines torch==2.13.0 is a
# local CPU wheel; elsewhere set TORCH_INDEX_URL=https://download.pytorch.org/whl/cpu to avoid
# pulling a multi-GB CUDA build.
TORCH_SPEC ?= torch==2.13.0
TORCH_INDEX_URL ?=
PYTEST_ARGS ?=
DEMO_ARGS ?=

.PHONY: demo test test-slow test-all lint parity-report clean-venv

$(BIN)/.installed-base: pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	$(BIN)/python -m pip install -q -e .
	touch $@

$(BIN)/.installed-dev: pyproject.toml $(BIN)/.installed-base
	$(BIN)/python -m pip install -q "$(TORCH_SPEC)" $(if $(TORCH_INDEX_URL),--index-url $(TORCH_INDEX_URL),)
	$(BIN)/python -m pip install -q -e ".[dev,parity,tpu,gcs-test]"
	touch $@

# the slow tier's references of real models (tests/test_parity_zoo.py); kept out of make test's
# install
$(BIN)/.installed-zoo: pyproject.toml $(BIN)/.installed-dev
	$(BIN)/python -m pip install -q -e ".[zoo]"
	touch $@

DEMO_RUN ?= runs/trm_sudoku_tiny

demo: $(BIN)/.installed-base
	$(BIN)/python -m train.main +experiment=trm_sudoku_tiny $(DEMO_ARGS)
	$(BIN)/python -m train.evaluate $(DEMO_RUN) --show 1
	@echo "run directory: $(DEMO_RUN) (config.yaml; metrics: $(DEMO_RUN)/metrics.jsonl," \
	  "$(DEMO_RUN)/final.json; checkpoints: $(DEMO_RUN)/checkpoints/<step>/)"

test: $(BIN)/.installed-dev
	$(BIN)/python -m pytest -m "not slow" -n 2 --timeout=900 $(PYTEST_ARGS)

test-slow: $(BIN)/.installed-zoo
	$(BIN)/python -m pytest -m "slow" -n 2 --timeout=1800 $(PYTEST_ARGS)

test-all: $(BIN)/.installed-zoo
	$(BIN)/python -m pytest $(PYTEST_ARGS)

lint: $(BIN)/.installed-dev
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .

parity-report: $(BIN)/.installed-dev
	$(BIN)/python -m parity gpt
	$(BIN)/python -m parity trm

clean-venv:
	rm -rf $(VENV)
