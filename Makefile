# The two commands a newcomer needs: `make run` and `make test`. Both install what they need.
PYTHON ?= python3.11
VENV   := .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed

.PHONY: install run test clean

install: $(STAMP)

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --disable-pip-version-check -e '.[test]'
	touch $(STAMP)

# The demo: the dispatcher over fake providers on loopback (no keys, no network).
run: install
	$(PY) -m drills.demo

# pytest's exit code 5 means "no tests collected"; anything else non-zero is a failure.
test: install
	$(PY) -m pytest -q; rc=$$?; if [ $$rc -eq 5 ]; then echo "pytest: no tests collected"; exit 0; fi; exit $$rc

clean:
	rm -rf $(VENV) *.egg-info
