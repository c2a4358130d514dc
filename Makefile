# Every target installs what it needs into .venv first, so each works on a fresh machine.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
KERNELS_STAMP := $(VENV)/.installed-kernels
export PYTHONHASHSEED := 0

.PHONY: install demo test test-slow test-lab test-portable test-kernel lint docs dist bench clean

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)

$(STAMP): $(BIN)/python pyproject.toml constraints.txt
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -c constraints.txt torch==2.13.0
	$(BIN)/python -m pip install --quiet -c constraints.txt -e ".[dev,analysis,tensorboard,text,sweep,docs,huggingface]"
	touch $(STAMP)

# Triton (about 1 GB) only for the kernel tests, which run it under its interpreter on a CPU
$(KERNELS_STAMP): $(STAMP)
	$(BIN)/python -m pip install --quiet -c constraints.txt -e ".[kernels]"
	touch $(KERNELS_STAMP)

install: $(STAMP)

demo: $(STAMP)
	$(BIN)/hyla demo --out runs/demo --records lab/runs

# Triton kernels run under the interpreter on CPU (tiny sizes); exit code 5 = none collected.
# The main suite runs last so that its summary line closes the output.
# On an AMD CPU the suite runs as the `hyla` command does there, with MKL's vendor check overridden
# (`python -m hyla.cpu --auto` prints the preload there, nothing on an Intel CPU): the commands the tests
# start then need no re-execution; test-portable checks the float-sensitive tests without it too.
# `make test` is the library's tier (tests/, the README and guide examples included), without the tests marked
# slow; `make test-slow` runs those, `make test-lab` the reproduction lab's (lab/tests); CI runs all three.
test: $(STAMP)
	preload=$$($(BIN)/python -m hyla.cpu --auto); \
	{ env $$preload TRITON_INTERPRET=1 $(BIN)/python -m pytest -q --durations=5 -m kernel tests || [ $$? -eq 5 ]; } && \
	env $$preload $(BIN)/python -m pytest -q -n 2 --durations=15 -m "not kernel and not slow" tests

test-slow: $(STAMP)
	preload=$$($(BIN)/python -m hyla.cpu --auto); \
	env $$preload $(BIN)/python -m pytest -q -n 2 --durations=10 -m "slow and not kernel" tests

test-lab: $(STAMP)
	preload=$$($(BIN)/python -m hyla.cpu --auto); \
	env $$preload $(BIN)/python -m pytest -q -n 2 --durations=10 lab/tests

# The float-sensitive tests again under other CPU dispatch paths (what another CPU would pick): each
# promise must hold on any x86-64 CPU, exact where the arithmetic is the same, else within its noise floor.
# The compiled-step tests too: code compiled under one dispatch must never be loaded under another.
PORTABLE_SETTINGS := ATEN_CPU_CAPABILITY=avx2 ATEN_CPU_CAPABILITY=default \
	MKL_ENABLE_INSTRUCTIONS=AVX2,ONEDNN_MAX_CPU_ISA=AVX2 OMP_NUM_THREADS=1,MKL_NUM_THREADS=1
# Last, with MKL's vendor check overridden (hyla.cpu: what the `hyla` command preloads on an AMD CPU).
test-portable: $(STAMP)
	@for setting in $(PORTABLE_SETTINGS); do \
		echo "== $$setting"; \
		env $$(echo $$setting | tr , ' ') $(BIN)/python -m pytest -q -n 2 -m "float_sensitive or compiled" tests || exit 1; \
	done
	@if preload=$$($(BIN)/python -m hyla.cpu); then echo "== $$preload"; \
		env $$preload $(BIN)/python -m pytest -q -n 2 -m "float_sensitive or compiled" tests; fi

test-kernel: $(KERNELS_STAMP)
	TRITON_INTERPRET=1 $(BIN)/python -m pytest -q -m kernel tests

lint: $(STAMP)
	$(BIN)/ruff check src tests benchmarks lab
	$(BIN)/ruff format --check src tests benchmarks lab

# The guides (docs/, mkdocs.yml) and the API reference from the docstrings, into site/; a broken link, a
# missing page or a docstring griffe cannot parse fails the build.
docs: $(STAMP)
	NO_MKDOCS_2_WARNING=1 $(BIN)/mkdocs build --strict --site-dir site

# The sdist and the wheel into dist/ (built in an isolated environment), then twine's check of their metadata
# and README; tests/test_packaging.py installs such a wheel and runs the README's commands from elsewhere.
dist: $(STAMP)
	rm -rf dist
	$(BIN)/python -m build --outdir dist .
	$(BIN)/twine check --strict dist/*

# The CPU tables in lab/tables/ (see each file for its exact command); lab/gpu/ for a GPU.
bench: $(STAMP)
	$(BIN)/hyla bench step --task sraven --variants softmax,linear,hyla,hyla_plus --steps 30 --json lab/tables/bench_step_sraven_cpu.json
	$(BIN)/hyla bench step --task fuzzy_logic --variants softmax,linear,hyla --steps 30 --json lab/tables/bench_step_fuzzy_cpu.json
	$(BIN)/hyla bench data --task sraven --batch-sizes 128,4096,16384 --repeats 10 --ambiguity 100000
	$(BIN)/hyla bench train --task fuzzy_logic --variants softmax,hyla --seeds 3 --steps 20 --repeats 3 --json lab/tables/train_throughput_fuzzy_cpu.json

clean:
	rm -rf $(VENV) runs site dist build .pytest_cache
