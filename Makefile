# On a fresh machine: `make demo`, `make test` and, as root, `make test-cluster` (each sets up
# .venv first).
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.mxlarge-installed

.PHONY: demo test test-slow test-cluster test-cluster-slow test-ui bench bench-cluster bench-peers bench-peers-cluster lint typecheck clean

$(STAMP): setup.cfg pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -e ".[cpu,test]"
	touch $(STAMP)

# The digits recipe as a local dist_sync job: scheduler, 1 server, 2 workers on 127.0.0.1,
# tracked in ./mlruns.db (see `mlflow ui --backend-store-uri sqlite:///mlruns.db`).
demo: $(STAMP)
	$(BIN)/mxlarge launch experiments/proxy/digits-largebatch.yaml -n 2 -s 1

# The fast tier (<= 10 min on 2 cores); `make test-slow` runs the rest (tests marked `slow`:
# the longest launched jobs, sweeps, restarts, resumes). CI runs both.
test: $(STAMP)
	$(BIN)/python -m pytest -q --ignore=tests/cluster --ignore=tests/ui -m "not slow"

test-slow: $(STAMP)
	$(BIN)/python -m pytest -q --ignore=tests/cluster --ignore=tests/ui -m slow

# The MLflow UI in a real browser: headless Chromium against `mlflow server` on 127.0.0.1, on a
# store made by a short launch, a 2-cell sweep and a failed launch (tests/ui; installs Debian's
# chromium when missing, as root).
test-ui: $(STAMP)
	command -v chromium >/dev/null || \
	  { test "$$(id -u)" = 0 || { echo "test-ui: needs chromium (apt-get install chromium, as root)"; exit 1; }; \
	    apt-get update -qq && apt-get install -y -qq --no-install-recommends chromium; }
	$(BIN)/python -m pytest -q tests/ui

# Real ssh, Open MPI and Slurm jobs across network-namespace hosts on this machine (root; installs
# its Debian packages when missing). See mxlarge/testbed.py and docs/launching.md.
test-cluster: $(STAMP)
	$(BIN)/python -m pytest -q tests/cluster -m "not slow"

test-cluster-slow: $(STAMP)
	$(BIN)/python -m pytest -q tests/cluster -m slow

bench: $(STAMP)
	$(BIN)/python -m benchmarks.run

# Push/pull against tc-shaped links on the namespace testbed (root; installs its Debian packages
# when missing). Results in benchmarks/results/cluster/.
bench-cluster: $(STAMP)
	$(BIN)/python -m benchmarks.run --only cluster_link,wire16 --out benchmarks/results/cluster

# mxlarge against MXNet's own gluon.Trainer on dist_sync and Horovod-MXNet (gloo), same nets and
# data, 2 workers on 127.0.0.1 -> benchmarks/results/peers.{md,json} (not part of `make test`).
# Builds Horovod into the venv first when it is missing (setup.cfg extra `peers`; cmake and g++
# from apt-get when root and missing).
PEERS_STAMP := $(VENV)/.mxlarge-peers-installed
HOROVOD_BUILD := HOROVOD_WITH_MXNET=1 HOROVOD_WITH_GLOO=1 HOROVOD_WITHOUT_MPI=1 \
	HOROVOD_WITHOUT_TENSORFLOW=1 HOROVOD_WITHOUT_PYTORCH=1 HOROVOD_CPU_OPERATIONS=gloo MAKEFLAGS=-j2

$(PEERS_STAMP): $(STAMP)
	command -v cmake >/dev/null && command -v g++ >/dev/null || \
	  { test "$$(id -u)" = 0 || { echo "bench-peers: Horovod's build needs cmake and g++ (apt-get install cmake g++, as root)"; exit 1; }; \
	    apt-get update -qq && apt-get install -y -qq --no-install-recommends cmake g++; }
	$(BIN)/python -c "import horovod.mxnet" 2>/dev/null || { \
	  $(BIN)/python -m pip install --quiet setuptools wheel && \
	  $(HOROVOD_BUILD) $(BIN)/python -m pip install --quiet --no-cache-dir --no-build-isolation -e ".[cpu,peers]"; }
	touch $(PEERS_STAMP)

bench-peers: $(PEERS_STAMP)
	$(BIN)/python -m benchmarks.peers

# The same on the namespace testbed (mxlarge/testbed.py), every committed testbed part: 3 hosts,
# tc tbf 1 Gbit/s then 200 Mbit/s per host, servers co-located (ResNet-50 at 200 Mbit/s against
# the 16-bit peers too), then the servers on 3 hosts of their own (root only; holds
# /var/tmp/mxlarge-testbed.lock while the testbed is in use).
bench-peers-cluster: $(PEERS_STAMP)
	$(BIN)/python -m benchmarks.peers --part testbed --rate 1gbit --peers mxlarge,gluon_kv,gluon,horovod
	$(BIN)/python -m benchmarks.peers --part testbed --rate 200mbit --nets demo,resnet20 --peers mxlarge,gluon_kv,gluon,horovod
	$(BIN)/python -m benchmarks.peers --part testbed --rate 200mbit --nets resnet50 --peers mxlarge,mxlarge_fp16,horovod,horovod_fp16
	$(BIN)/python -m benchmarks.peers --part testbed --server-hosts 3 --nets resnet50 --peers mxlarge,horovod

# Lint: ruff over the code (ruff.toml); codespell over the docs and the package's docstrings and
# comments (setup.cfg [codespell]: what it skips, and each word it must not take for a typo);
# pymarkdown over every Markdown page (pyproject.toml [tool.pymarkdown]: prose wrapped at 100
# columns, tables and code blocks exempt, and each rule turned off or changed, with why).
# The generated pages, docs/config.md and docs/performance.md's tables, are written to pass it.
# The sweep reports (docs/results/<sweep>/report.md) are results files that `mxlarge report`
# writes from a sweep's MLflow store: pymarkdown leaves them out, as tests/test_prose.py does.
DOCS_MD := README.md CHANGELOG.md docs launch/README.md benchmarks/README.md

lint: $(STAMP)
	$(BIN)/ruff check mxlarge tests benchmarks
	$(BIN)/codespell $(DOCS_MD) mxlarge
	$(BIN)/pymarkdown scan --recurse --exclude 'docs/results/*/report.md' $(DOCS_MD)

# mypy over mxlarge/ at the level written down in setup.cfg's [mypy] section.
typecheck: $(STAMP)
	$(BIN)/mypy mxlarge

clean:
	rm -rf $(VENV) mlruns.db mlruns mxlarge-runs .pytest_cache .mypy_cache
