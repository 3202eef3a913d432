"""Fixtures of the cluster tests: one namespace testbed per session, torn down even on failure.

Run with ``make test-cluster`` (as root). After the last test the finalizer tears the testbed
down and checks that nothing of it is left: no job process in its hosts at teardown (only its
daemons), no namespace, no route, no process started from its directory.
"""
from __future__ import annotations

import os
import re
import subprocess
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from mxlarge.testbed import GUARD_ROUTE, PREFIX, Testbed, TestbedError, exclusive


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """The testbed's own checks (test_testbed.py) first: every other test relies on what they
    check, and they must not wait behind the Slurm node test_partition.py cuts off, which
    slurmctld took 57 s to count as up again after its link was back (one run)."""
    items.sort(key=lambda item: item.path.name != "test_testbed.py")  # stable: the rest keep order


def testbed_processes(tb: Testbed) -> list[int]:
    """Live processes whose argv or environment mentions the testbed's directory (every job of
    these tests runs from under it; other jobs on a shared machine do not)."""
    # the directory, not its lock file beside it (another session waiting with flock on
    # /var/tmp/mxlarge-testbed.lock is no process of these tests)
    needle = (str(tb.root) + "/").encode()
    found = []
    for d in Path("/proc").iterdir():
        if not d.name.isdigit() or int(d.name) == os.getpid():
            continue
        try:
            seen = (d / "environ").read_bytes() + (d / "cmdline").read_bytes()
            state = (d / "stat").read_text().rsplit(")", 1)[1].split()[0]
        except OSError:
            continue
        if needle in seen and state != "Z":
            found.append(int(d.name))
    return found


@pytest.fixture(scope="session")
def testbed() -> Iterator[Testbed]:
    with exclusive():  # other users of the namespaces (the cluster benchmarks) wait
        yield from _testbed()


def _testbed() -> Iterator[Testbed]:
    # Jobs run on h0..h2; h3 is the host outside every job (test_foreign_host.py).
    tb = Testbed(n=4)
    try:
        tb.up()
    except TestbedError as e:
        pytest.fail(str(e), pytrace=False)
    try:
        yield tb
    finally:
        # SIGTERM to the daemons, then SIGKILL to whatever is still in a host. A slow daemon
        # (slurmd waiting for a step daemon on a loaded box) may be among those; a process of a
        # job (started from the work directory) must not.
        leftovers = tb.down()
        netns = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
        routes = subprocess.run(["ip", "route", "show", GUARD_ROUTE], capture_output=True,
                                text=True).stdout
        assert not [line for line in leftovers if str(tb.root / "work") in line], leftovers
        assert not re.search(rf"^{PREFIX}", netns, re.M), netns
        assert routes.strip() == "", routes
        assert testbed_processes(tb) == []
        assert not tb.root.exists()


@pytest.fixture
def work(testbed: Testbed, request: pytest.FixtureRequest) -> Path:
    """A directory every host sees (not under /tmp, which is per host), unique per test."""
    name = re.sub(r"\W+", "-", request.node.name)[:60] + "-" + uuid.uuid4().hex[:6]
    d = testbed.root / "work" / name
    d.mkdir(parents=True)
    return d


@pytest.fixture(scope="session")
def reference(tmp_path_factory: pytest.TempPathFactory) -> dict[str, list[dict]]:
    """The weights every 2+2 job of the equivalence recipe must reproduce
    (:func:`tests.cluster.test_jobs.reference_weights`)."""
    from tests.cluster.test_jobs import reference_weights

    return reference_weights(tmp_path_factory.mktemp("reference"))
