# Quick start:  make demo   (set up + run the demo)    make test   (set up + run the tests)
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.bertforge-installed

.PHONY: setup demo test bench clean

setup: $(STAMP)

$(STAMP): pyproject.toml scripts/setup.sh
	bash scripts/setup.sh $(VENV)
	touch $(STAMP)

demo: setup
	$(PY) -m bertforge demo

test: setup
	$(PY) -m pytest -n 2 --durations=15

bench: setup
	$(PY) benchmarks/step_time.py

clean:
	rm -rf $(VENV) runs .pytest_cache
