# The two commands a newcomer needs: `make run` and `make test`. Both install what they need.
PYTHON ?= python3.11
VENV   := .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed

.PHONY: install run demo docs test test-quick test-clients lint drill bench bench-quick bench-reliability browser redis clean

install: $(STAMP)

# The first install takes a minute or two: say so, and show it moving (a dot per package pip
# fetches; its warnings and errors pass as they are).
$(STAMP): SHELL := /bin/bash
$(STAMP): pyproject.toml
	@echo "Installing lanes and its test tools into $(VENV): a minute or two the first time"
	$(PYTHON) -m venv $(VENV)
	@set -o pipefail; $(PY) -m pip install --disable-pip-version-check -e '.[test,otel]' | awk \
	  '/^Collecting/ { if (!n++) printf "  fetching "; printf "."; fflush() } \
	   /^Installing collected/ { printf " %d packages\n  installing...", n; fflush() } \
	   /^Successfully installed/ { print " done" }'
	touch $(STAMP)

# The sidecar on simulated providers (no keys, no network): http://127.0.0.1:4098
# (`make run PORT=4099` for another port)
PORT ?= 4098
run: install
	$(PY) -m lanes serve --simulate --port $(PORT)

# The library demo: the dispatcher over fake providers, one line per job.
demo: install
	$(PY) -m lanes.drills.demo

# The page test drives Debian's Chromium; install it when we can (root with apt), else that one
# test skips and says why.
browser:
	@command -v chromium >/dev/null 2>&1 || { [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1 && \
	  (apt-get install -y -q chromium >/dev/null 2>&1 || (apt-get update -q >/dev/null 2>&1 && \
	   apt-get install -y -q chromium >/dev/null 2>&1)) || echo "chromium not installed: the browser test will skip"; }

# The shared-state tests run a real redis-server (Debian's package) on a free loopback port.
redis:
	@command -v redis-server >/dev/null 2>&1 || [ -x /usr/bin/redis-server ] || { [ "$$(id -u)" = 0 ] && \
	  command -v apt-get >/dev/null 2>&1 && (apt-get install -y -q redis-server >/dev/null 2>&1 || \
	  (apt-get update -q >/dev/null 2>&1 && apt-get install -y -q redis-server >/dev/null 2>&1)) || \
	  echo "redis-server not installed: the shared-state tests will skip"; }

# ruff (lint and format) and mypy: strict on lanes/, lighter on the tests and benchmarks.
LINT_STAMP := $(VENV)/.lint-installed
MYPY_LIGHT := --allow-untyped-defs --allow-incomplete-defs --allow-untyped-calls \
              --allow-untyped-decorators --no-warn-return-any --check-untyped-defs
$(LINT_STAMP): pyproject.toml $(STAMP)
	$(PY) -m pip install -q --disable-pip-version-check -e '.[test,lint]'
	touch $(LINT_STAMP)

lint: $(LINT_STAMP)
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .
	$(VENV)/bin/mypy
	$(VENV)/bin/mypy $(MYPY_LIGHT) tests bench

# The documentation site (MkDocs Material) from docs/ into site/; --strict: a broken link or a page
# missing from the nav fails the build, as in CI. The reference pages' generated blocks (the config
# keys, the `lanes` command, the lane modules) are rewritten from the code first.
DOCS_STAMP := $(VENV)/.docs-installed
$(DOCS_STAMP): pyproject.toml $(STAMP)
	$(PY) -m pip install -q --disable-pip-version-check -e '.[docs]'
	touch $(DOCS_STAMP)

docs: $(DOCS_STAMP)
	$(PY) docs/gen_reference.py
	NO_MKDOCS_2_WARNING=1 $(VENV)/bin/mkdocs build --strict --site-dir site

# The whole suite, one worker per core (pytest-xdist). --dist loadgroup keeps the tests of a
# module that share a module-scoped process or recording on one worker (tests/conftest.py groups
# them), so it is made once, not once per worker. Compiled modules (and pytest's rewritten test
# modules) are cached in .venv/pycache even where PYTHONDONTWRITEBYTECODE is set: every worker
# and every `lanes serve` the tests start would otherwise compile them again.
# pytest's exit code 5 means "no tests collected"; anything else non-zero is a failure.
WORKERS ?= auto
PYTEST := PYTHONDONTWRITEBYTECODE= PYTHONPYCACHEPREFIX=$(CURDIR)/$(VENV)/pycache \
          $(PY) -m pytest -q -n $(WORKERS) --dist loadgroup
test: install browser redis
	$(PYTEST); rc=$$?; if [ $$rc -eq 5 ]; then echo "pytest: no tests collected"; exit 0; fi; exit $$rc

# The inner loop: the suite without the tests that start processes, a browser or a herd (`slow`),
# each property searched a fifth as deeply (LANES_TEST_QUICK, tests/helpers.py's `examples`).
test-quick: install
	LANES_TEST_QUICK=1 $(PYTEST) -m 'not slow'; rc=$$?; if [ $$rc -eq 5 ]; then echo "pytest: no tests collected"; exit 0; fi; exit $$rc

# The real clients, unmodified, against `lanes serve --simulate` (not in `make test`: they are
# heavy): the OpenAI Agents SDK, the Anthropic SDK, the Responses helpers, Google's google-genai
# (the `test` and `clients` extras), and from the npm registry, pinned in tests/clients/package.json: Codex,
# Claude Code, Gemini CLI and the Vercel AI SDK. Where npm can not install them their tests skip
# and say why.
CLIENTS := .clients
CLIENTS_STAMP := $(VENV)/.clients-installed
$(CLIENTS_STAMP): pyproject.toml $(STAMP)
	$(PY) -m pip install -q --disable-pip-version-check -e '.[test,clients]'
	touch $(CLIENTS_STAMP)

$(CLIENTS)/.installed: tests/clients/package.json tests/clients/package-lock.json
	@mkdir -p $(CLIENTS) && rm -f $(CLIENTS)/npm-failed && \
	  cp tests/clients/package.json tests/clients/package-lock.json $(CLIENTS)/ && \
	  { command -v npm >/dev/null 2>&1 || { echo "npm is not installed" > $(CLIENTS)/npm-failed; exit 0; }; \
	    (cd $(CLIENTS) && npm ci --no-audit --no-fund --loglevel=error >npm.log 2>&1) && touch $(CLIENTS)/.installed || \
	    { echo "npm ci failed: $$(tail -n 1 $(CLIENTS)/npm.log)" > $(CLIENTS)/npm-failed; \
	      echo "npm could not install the clients: their tests will skip"; }; }

test-clients: $(CLIENTS_STAMP) $(CLIENTS)/.installed
	$(PY) -m pytest -q --clients tests/clients

# The chaos drills: break lanes and providers on purpose; one line per drill with its figure.
drill: install redis
	$(PY) -m lanes drill all

# Benchmarks: ours beside the limit, direct, LiteLLM (installed into its own virtualenv, never
# into the project's) and the Portkey gateway. Writes bench/results/<date>.json and
# docs/benchmarks.md.
LITELLM := bench/.venv-litellm/bin/litellm
$(LITELLM):
	$(PYTHON) -m venv bench/.venv-litellm
	bench/.venv-litellm/bin/pip install -q --disable-pip-version-check 'litellm[proxy]'

# The Portkey gateway, a Node peer of the agent-sized requests (bench/agent.py), pinned in
# bench/portkey/package.json and its lock: @portkey-ai/gateway 1.15.2 with the @hono/node-server
# (1.13.5) and hono (4.9.7) its own repository's lock pins — a newer node-server breaks its
# streams. Without Node 20 or npm, or where npm fails, the peer is skipped and says why.
PORTKEY := bench/.portkey
$(PORTKEY)/.installed: bench/portkey/package.json bench/portkey/package-lock.json
	@mkdir -p $(PORTKEY) && rm -f $(PORTKEY)/npm-failed && \
	  cp bench/portkey/package.json bench/portkey/package-lock.json $(PORTKEY)/ && \
	  { command -v npm >/dev/null 2>&1 || { echo "npm is not installed" > $(PORTKEY)/npm-failed; exit 0; }; \
	    (cd $(PORTKEY) && npm ci --ignore-scripts --no-audit --no-fund --loglevel=error >npm.log 2>&1) && \
	    touch $(PORTKEY)/.installed || \
	    { echo "npm ci failed: $$(tail -n 1 $(PORTKEY)/npm.log)" > $(PORTKEY)/npm-failed; \
	      echo "npm could not install the Portkey gateway: the bench skips it"; }; }

bench: install redis $(LITELLM) $(PORTKEY)/.installed
	$(PY) -m pip install -q --disable-pip-version-check -e '.[test,bench]'
	$(PY) -m bench.run

bench-quick: install redis $(LITELLM) $(PORTKEY)/.installed
	$(PY) -m pip install -q --disable-pip-version-check -e '.[test,bench]'
	$(PY) -m bench.run --quick

# Robustness figures (hostile bodies, connection floods, slow clients, state faults) against real
# sidecar processes: bench/results/<date>-reliability.json and docs/reliability.md.
bench-reliability: install redis
	$(PY) -m bench.reliability

clean:
	rm -rf $(VENV) *.egg-info
