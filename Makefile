# degnn: `make demo` and `make test` do all set-up on a fresh machine.
PY ?= python3
VENV := .venv
VPY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
TORCH_INDEX ?= https://download.pytorch.org/whl/cpu
# the exact versions `make setup` (and so CI) installs, as pip -c pins
CONSTRAINTS := .ci/constraints.txt
TORCH := $(shell sed -n 's/^torch==//p' $(CONSTRAINTS))

.PHONY: setup demo test bench bench-quick clean clean-runs cleanup

$(STAMP): pyproject.toml $(CONSTRAINTS)
	test -x $(VPY) || $(PY) -m venv $(VENV)
	$(VPY) -m pip install -q --upgrade pip
	# torch first, the CPU build of the version the constraints pin: from the local wheel cache
	# where there is one, else from PyTorch's CPU index (a bare `torch` from PyPI pulls a multi-GB
	# CUDA build) (its dependencies then from the usual index; an ordinary host takes torch and
	# them from PyTorch's CPU index and PyPI)
	( $(VPY) -m pip install -q --no-index --no-deps torch==$(TORCH) 2>/dev/null && \
	  $(VPY) -m pip install -q torch==$(TORCH) -c $(CONSTRAINTS) ) || \
	  $(VPY) -m pip install -q torch==$(TORCH) -c $(CONSTRAINTS) --index-url $(TORCH_INDEX) --extra-index-url https://pypi.org/simple
	# degnn and the rest at the versions CI tests (pyproject.toml has the ranges, docs/install.md)
	$(VPY) -m pip install -q -e '.[test]' -c $(CONSTRAINTS)
	touch $(STAMP)

setup: $(STAMP)

demo: setup
	$(VPY) -m degnn.demo $(ARGS)

# two workers, each taking whole test files (a file's cluster tests share its fixed subnet and
# ports): a cluster test leaves a third of the 2 cores idle while processes start and wait
TEST_WORKERS ?= 2

test: setup
	$(VPY) -m pytest -q -n $(TEST_WORKERS) --dist loadfile tests

# each bench config writes its own report under benchmarks/results/
BENCHES ?= headline target default parity tma lamp link

# the netns links' measured efficiency first (the projection in every report reads it)
bench: setup
	set -e; $(VPY) -m benchmarks.link_probe; for b in $(BENCHES); do $(VPY) -m benchmarks bench=$$b; done; \
	$(VPY) -m benchmarks.results_md

bench-quick: setup
	$(VPY) -m benchmarks bench=quick && $(VPY) -m benchmarks.results_md

# leftovers of killed launchers: namespaces, links, holders, processes, DGL shared memory
cleanup:
	$(VPY) -m degnn.launch --cleanup

# the venv and caches; every run's results and checkpoints stay (make clean-runs removes them)
clean:
	rm -rf $(VENV) outputs multirun .pytest_cache

clean-runs:
	rm -rf runs
