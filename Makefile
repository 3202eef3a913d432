# On a fresh machine: `make demo`, `make test` and, as root, `make test-cluster` (each sets up
# .venv first).
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.mxlarge-installed

.PHONY: demo test test-cluster bench bench-cluster lint clean

$(STAMP): setup.cfg pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -e ".[cpu,test]"
	touch $(STAMP)

# The digits recipe as a local dist_sync job: scheduler, 1 server, 2 workers on 127.0.0.1,
# tracked in ./mlruns.db (see `mlflow ui --backend-store-uri sqlite:///mlruns.db`).
demo: $(STAMP)
	$(BIN)/mxlarge launch experiments/proxy/digits-largebatch.yaml -n 2 -s 1

test: $(STAMP)
	$(BIN)/python -m pytest -q --ignore=tests/cluster

# Real ssh, Open MPI and Slurm jobs across network-namespace hosts on this machine (root; installs
# its Debian packages when missing). See tests/cluster/testbed.py and launch/README.md.
test-cluster: $(STAMP)
	$(BIN)/python -m pytest -q tests/cluster

bench: $(STAMP)
	$(BIN)/python -m benchmarks.run

# Push/pull against tc-shaped links on the namespace testbed (root; installs its Debian packages
# when missing). Results in benchmarks/results/cluster/.
bench-cluster: $(STAMP)
	$(BIN)/python -m benchmarks.run --only cluster_link --out benchmarks/results/cluster

lint: $(STAMP)
	$(BIN)/ruff check mxlarge tests benchmarks

clean:
	rm -rf $(VENV) mlruns.db mlruns mxlarge-runs .pytest_cache
