# Two commands: `make demo` (set up, then grade the reference solutions of every assignment)
# and `make test` (set up, then the whole suite, notebooks included).
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed-$(shell cksum < pyproject.toml | cut -d' ' -f1)
# PyPI's torch for Linux x86-64 is the multi-GB CUDA build: there the pinned CPU build comes first,
# from PyTorch's CPU index, and the install below keeps it (`make setup TORCH_BUILD=pypi`: PyPI's).
TORCH_CPU_INDEX ?= https://download.pytorch.org/whl/cpu
TORCH_BUILD     ?= $(if $(filter Linux-x86_64,$(shell uname -s)-$(shell uname -m)),cpu,pypi)
TORCH_PIN       := $(shell grep -o 'torch==[0-9.]*' pyproject.toml)
GPU_PY          := $(if $(wildcard $(BIN)/python),$(BIN)/python,$(PYTHON))

.PHONY: setup demo test deploy-test selftest release gpu-check gpu-bench clean

setup: $(STAMP)

$(STAMP): pyproject.toml
	@test -x $(BIN)/python || $(PYTHON) -c 'import sys; sys.exit(sys.version_info < (3, 11))' || \
	  { echo "make setup: $(PYTHON) is older than Python 3.11, which the pinned numpy and matplotlib need; try: make setup PYTHON=python3.12" >&2; exit 2; }
	@test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	@if [ "$(TORCH_BUILD)" = cpu ]; then $(BIN)/python -m pip install --quiet --disable-pip-version-check \
	  --no-deps --index-url $(TORCH_CPU_INDEX) '$(TORCH_PIN)+cpu'; fi
	$(BIN)/python -m pip install --quiet --disable-pip-version-check -e '.[dev]'
	@rm -f $(VENV)/.installed-* && touch $@

# The main job: the autograder on the bundled solutions (`make demo A=a3`: one assignment). Exit 3 means
# "GPU checks not run here", which is the expected result on a CPU machine.
demo: setup
	@$(BIN)/python -m autograder grade $(or $(A),all) --submission solutions --json bench_out/demo_results.json; \
	  code=$$?; if [ $$code -eq 3 ]; then echo "(GPU-only checks were not run: no CUDA device here)"; \
	  elif [ $$code -ne 0 ]; then exit $$code; fi

# The deployment paths followed in temporary folders: the student repository built from a release,
# the Gradescope packages, the class regrade, the benchmarks under torchrun (minutes: run with the
# deployments, so that `make test` keeps within 15 minutes on two cores).
DEPLOY_PATHS = tests/test_student_release.py tests/test_gradescope.py tests/test_regrade.py tests/test_torchrun.py

# Two pytest workers, one test file (or notebook) at a time each. The deployments have their own target.
test: setup
	$(BIN)/python -m autograder release --check
	$(BIN)/python -m pytest -n 2 --ignore=tests/deploy $(addprefix --ignore=,$(DEPLOY_PATHS))

# The deployments (CI runs it after `make test`): DEPLOY_PATHS, then as deployed: a Gradescope package
# unzipped at /autograder and installed by its own setup.sh (root: a private mount namespace), a fresh
# clone of the student repository set up by its own `make setup`, its notebooks run on the stubs, and
# what gpu-check runs through the Triton interpreter, under the GPU machine's Triton (3.6).
deploy-test: setup
	$(BIN)/python -m pytest -n 2 $(DEPLOY_PATHS)
	$(BIN)/python -m pytest -n 0 -s tests/deploy

selftest: setup
	$(BIN)/python -m autograder selftest all

release: setup
	$(BIN)/python -m autograder release

# On a CUDA machine as it comes (no network, its own CUDA torch, no nbval): every gpu-marked test, the
# solutions graded on the GPU, a class regraded (--device cuda --cpu-results), the kernel benchmark, one
# report (bench_out/gpu_check/report.md) with the versions that ran beside the pins. No setup, no venv,
# nothing installed: it runs on the first interpreter whose torch sees a GPU (this one, GPU_PYTHON, .venv,
# python3), the checkout on PYTHONPATH (autograder/gpu_check.py). On a CPU machine: says so and exits 0.
gpu-check:
	PYTHONPATH=$(CURDIR)/lib:$(CURDIR) $(GPU_PY) -m autograder gpu-check

# How fast, where gpu-check says how right: every benchmark whose figures need a GPU (kernels, attention,
# cross-entropy, the GPT-2 profile, inference), logs and plots in bench_out/gpu_bench, summary.md. Same
# interpreter rule as gpu-check; `make gpu-bench BUDGET_S=300` bounds the whole run (scaletrain/bench_gpu.py).
gpu-bench:
	PYTHONPATH=$(CURDIR)/lib:$(CURDIR) $(GPU_PY) -m scaletrain.bench_gpu $(if $(BUDGET_S),--budget-s $(BUDGET_S))

clean:
	rm -rf $(VENV) bench_out results.json .pytest_cache
