# Two entry points: `make run` and `make test`. Both create .venv and install everything first.
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed

.PHONY: run test setup bench docs clean

$(STAMP): pyproject.toml Makefile
	python3 -m venv $(VENV)
	# The CPU wheel of torch 2.13.0 is the only torch we ever install here: any other version pulls CUDA. One
	# resolution for torch and the project; pip byte-compiles on one core (over half of a setup's time), so it
	# skips that and compileall does it on every core, but for the packages' own test suites (a fifth of the
	# source, never imported). Like pip, a file written for another Python (torch ships one in 3.12 syntax) is left
	# uncompiled, not an error.
	$(PY) -m pip install -q --upgrade pip  # the venv's own pip resolves this set ~12 s slower
	$(PY) -m pip install -q --no-compile torch==2.13.0 -e '.[all]'
	$(PY) -m compileall -q -j 0 -x '/tests/' $(VENV)/lib > /dev/null || true
	touch $(STAMP)

setup: $(STAMP)

run: $(STAMP)
	$(VENV)/bin/torchboost train

# every core (pytest-xdist, pyproject's addopts), one thread each; the 20 slowest tests listed at the end.
# Byte-code caches on even where the shell sets PYTHONDONTWRITEBYTECODE: without them every xdist worker rewrites
# the test modules' asserts (~10 s each) and every process a test starts recompiles torchboost.
test: $(STAMP)
	PYTHONDONTWRITEBYTECODE= $(PY) -m pytest -q --durations=20

bench: $(STAMP)
	$(PY) benchmarks/overhead.py

# The documentation site (mkdocs.yml, pages under docs/) into site/; a warning (a broken link or anchor, a page
# missing from the nav) fails the build. NO_MKDOCS_2_WARNING silences Material's end-of-life banner.
docs: $(STAMP)
	NO_MKDOCS_2_WARNING=1 $(PY) -m mkdocs build --strict --site-dir site

clean:
	rm -rf $(VENV) runs .pytest_cache
