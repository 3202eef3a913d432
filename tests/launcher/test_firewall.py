"""mxlarge.launcher.firewall without touching any host's rules: the ruleset, the port ranges,
where the filter is refused and why. The real rules on real hosts: tests/cluster/
test_foreign_host.py."""
import subprocess
import sys

import pytest

from mxlarge.launcher import firewall
from mxlarge.launcher.firewall import (
    FirewallError,
    job_filter,
    merge_ranges,
    refusals,
    ruleset,
)
from mxlarge.launcher.registry import backend_for


def test_port_ranges_merge_overlapping_and_adjacent_ones():
    assert merge_ranges([(10000, 49999), (9091, 9998), (32768, 60999)]) == \
        [(9091, 9998), (10000, 60999)]
    assert merge_ranges([(1, 5), (6, 9)]) == [(1, 9)]


def test_the_ruleset_refuses_new_connections_from_outside_the_job_only():
    assert ruleset("mxlarge_abc_42", ["198.18.0.10", "198.18.0.11"],
                   [(10000, 49999), (9091, 9998), (32768, 60999)]) == """\
table ip mxlarge_abc_42 {
  set job_hosts { type ipv4_addr; elements = { 198.18.0.10, 198.18.0.11 } }
  set refused { type inet_service; flags dynamic; size 65536; counter; }
  chain count {
    type filter hook input priority filter - 20; policy accept;
    iif "lo" accept
    ct state established,related accept
    ip saddr @job_hosts accept
    tcp dport { 9091-9998, 10000-60999 } ct state new add @refused { tcp dport }
  }
  chain input {
    type filter hook input priority filter - 10; policy accept;
    iif "lo" accept
    ct state established,related accept
    ip saddr @job_hosts accept
    tcp dport { 9091-9998, 10000-60999 } reject with tcp reset
  }
}
"""


def test_a_job_reports_the_attempts_at_its_own_ports():
    """A host's guard counts every port's attempts (another job's table there may have refused
    some at this job's ports first); the job sums its own processes' ports on that host, or
    every port while it knows none there."""
    said = "9091:3 41234:5 41300:2 "
    own = {"198.18.0.11:9091", "198.18.0.11:41234", "198.18.0.12:41300"}
    assert refusals(said, ["198.18.0.11", "127.0.0.1"], own) == (8, True)
    assert refusals(said, ["198.18.0.12"], own) == (2, True)
    assert refusals(said, ["198.18.0.13"], own) == (10, False)
    assert refusals("", ["198.18.0.11"], own) == (0, True)


def test_refused_where_it_cannot_apply_with_the_reason(monkeypatch):
    assert "127.0.0.1 only" in (backend_for("local").firewall_refusal() or "")
    assert "slurm" in (backend_for("slurm").firewall_refusal() or "")
    assert backend_for("ssh").firewall_refusal() is None
    assert backend_for("mpi").firewall_refusal() is None
    monkeypatch.setattr(firewall.os, "geteuid", lambda: 1000)
    assert "not run as root" in (firewall.local_refusal() or "")
    lines: list[str] = []
    with pytest.raises(FirewallError, match="--firewall on: the launcher does not run as root"):
        with job_filter("on", None, "j", [], (1, 2), lines.append):
            pass
    with job_filter("auto", None, "j", [], (1, 2), lines.append) as allowed:
        assert allowed is None  # the job runs, unfiltered, and says so
    assert lines == ["packet filter: off (the launcher does not run as root (nft needs "
                     "CAP_NET_ADMIN)); the job's ports take connections from anywhere (see "
                     "'Who can reach a job' in docs/security.md)"]


def test_off_and_local_say_nothing_and_install_nothing():
    lines: list[str] = []
    for mode, loopback in (("off", False), ("auto", True), ("off", True)):
        with job_filter(mode, None, "j", [], (1, 2), lines.append, loopback=loopback) as allowed:
            assert allowed is None
    assert lines == []
    with pytest.raises(ValueError, match="expected one of auto, on, off"):
        with job_filter("yes", None, "j", [], (1, 2), lines.append):
            pass


def test_the_front_end_refuses_on_for_a_local_job():
    r = subprocess.run([sys.executable, "-m", "mxlarge.launcher", "-n", "1", "--firewall", "on",
                        "--", "true"], capture_output=True, text=True, timeout=60)
    assert r.returncode == 2
    assert "--firewall on: a local job listens on 127.0.0.1 only" in r.stderr
