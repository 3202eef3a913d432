"""The pre-flight check's rules that need no other host (mxlarge/launcher/preflight.py; the
probe of real hosts is tests/cluster/test_partition.py's refused job)."""
from __future__ import annotations

import pytest

from mxlarge.launcher.preflight import HostCheckError, check_hosts, local_address


def test_a_scheduler_address_that_is_not_this_hosts_is_refused():
    # binding it tells (nothing is sent): 198.18.0.77 is no address of this host
    assert local_address("127.0.0.1") and not local_address("198.18.0.77")
    with pytest.raises(HostCheckError, match=r"^--host-ip 198\.18\.0\.77: not an address of "
                                             r"this host \(the scheduler binds it here\)$"):
        check_hosts({"127.0.0.1": 22}, "hostfile h", host_ip="198.18.0.77")


def test_loopback_only_jobs_are_not_probed(monkeypatch):
    """The tests' fake clusters (every host 127.0.0.1): no ssh, no connect."""
    def no_probe(*args, **kwargs):
        raise AssertionError("probed a loopback job")

    monkeypatch.setattr("mxlarge.launcher.preflight.unreachable_hosts", no_probe)
    monkeypatch.setattr("mxlarge.launcher.preflight.host_facts", no_probe)
    check_hosts({"127.0.0.1": 22, "127.0.0.2": 2222}, "hostfile h", firewall="on",
                host_ip="127.0.0.1")
