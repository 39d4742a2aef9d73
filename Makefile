# Two entry points: `make run` and `make test`. Both create .venv and install everything first.
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed

.PHONY: run test setup bench docs clean

$(STAMP): pyproject.toml Makefile
	python3 -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	# The CPU wheel of torch 2.13.0 is the only torch we ever install here: any other version pulls CUDA.
	$(PY) -m pip install -q torch==2.13.0
	$(PY) -m pip install -q -e '.[all]'
	touch $(STAMP)

setup: $(STAMP)

run: $(STAMP)
	$(VENV)/bin/torchboost train

# every core (pytest-xdist, pyproject's addopts), one thread each; the 20 slowest tests listed at the end
test: $(STAMP)
	$(PY) -m pytest -q --durations=20

bench: $(STAMP)
	$(PY) benchmarks/overhead.py

# The documentation site (mkdocs.yml, pages under docs/) into site/; a warning (a broken link or anchor, a page
# missing from the nav) fails the build. NO_MKDOCS_2_WARNING silences Material's end-of-life banner.
docs: $(STAMP)
	NO_MKDOCS_2_WARNING=1 $(PY) -m mkdocs build --strict --site-dir site

clean:
	rm -rf $(VENV) runs .pytest_cache
