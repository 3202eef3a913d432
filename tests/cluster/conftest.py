"""Fixtures of the cluster tests: one namespace testbed per session, torn down even on failure.

Run with ``make test-cluster`` (as root). After the last test the finalizer tears the testbed
down and checks that nothing of it is left: no namespace, no route, no daemon, no DMLC process.
"""
from __future__ import annotations

import os
import re
import subprocess
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.cluster.testbed import GUARD_ROUTE, PREFIX, Testbed, TestbedError


def dmlc_pids() -> list[int]:
    """Live processes, anywhere on the machine, with a ``DMLC_ROLE`` in their environment."""
    found = []
    for d in Path("/proc").iterdir():
        if not d.name.isdigit() or int(d.name) == os.getpid():
            continue
        try:
            if b"DMLC_ROLE=" in (d / "environ").read_bytes() and \
                    (d / "stat").read_text().rsplit(")", 1)[1].split()[0] != "Z":
                found.append(int(d.name))
        except OSError:
            continue
    return found


@pytest.fixture(scope="session")
def testbed() -> Iterator[Testbed]:
    tb = Testbed()
    before = set(dmlc_pids())  # other people's jobs on a shared machine are not ours to judge
    try:
        tb.up()
    except TestbedError as e:
        pytest.fail(str(e), pytrace=False)
    try:
        yield tb
    finally:
        tb.down()
        netns = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
        routes = subprocess.run(["ip", "route", "show", GUARD_ROUTE], capture_output=True,
                                text=True).stdout
        daemons = subprocess.run(["pgrep", "-f", str(tb.root)], capture_output=True,
                                 text=True).stdout
        assert not re.search(rf"^{PREFIX}", netns, re.M), netns
        assert routes.strip() == "", routes
        assert daemons.strip() == "", daemons
        assert not tb.root.exists()
        assert set(dmlc_pids()) <= before, set(dmlc_pids()) - before


@pytest.fixture
def work(testbed: Testbed, request: pytest.FixtureRequest) -> Path:
    """A directory every host sees (not under /tmp, which is per host), unique per test."""
    name = re.sub(r"\W+", "-", request.node.name)[:60] + "-" + uuid.uuid4().hex[:6]
    d = testbed.root / "work" / name
    d.mkdir(parents=True)
    return d
