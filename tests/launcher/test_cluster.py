"""The cluster launcher's pure parts: what reaches remote processes (environment, quoting)
and the hostfile checks (no processes but one shell; the backends themselves run in
tests/e2e/test_launcher.py and tests/cluster)."""
import subprocess
import sys

import pytest

from mxlarge.launcher.environment import OWNED_ENV, forwarded_env, render_command, shell_word
from mxlarge.launcher.hostfile import read_hostfile
from mxlarge.launcher.registry import backend_for

PY = sys.executable


def test_forwarded_env_and_quoting() -> None:
    environ = {"PYTHONPATH": "/a:/b", "MLFLOW_RUN_ID": "r1", "MLFLOW_TRACKING_TOKEN": "s3cr3t",
               "MXNET_ENGINE_TYPE": "NaiveEngine", "OMP_NUM_THREADS": "4", "HOME": "/h",
               "DMLC_INTERFACE": "ib0", "MXLARGE_LEAD": "0.2", "MXLARGE_OTHER": "1"}
    env = forwarded_env({"EXTRA": "x y"}, environ=environ)
    assert env == {"PYTHONPATH": "/a:/b", "MLFLOW_RUN_ID": "r1", "OMP_NUM_THREADS": "4",
                   "MXNET_ENGINE_TYPE": "NaiveEngine", "DMLC_INTERFACE": "ib0", "EXTRA": "x y",
                   "MXLARGE_LEAD": "0.2"}
    assert shell_word("a b$c\"d`e\\f") == '"a b\\$c\\"d\\`e\\\\f"'
    words = render_command(["python", "-c", "print('hi there')"], {"K": "v w"})
    # One shell layer must give back exactly the argv (the ssh layer is tested end to end).
    script = f"{PY} -c 'import sys; print(sys.argv[1:])' " + " ".join(words)
    argv = subprocess.run(["sh", "-c", script], capture_output=True, text=True,
                          check=True).stdout
    assert argv.strip() == repr(["env", "K=v w", "python", "-c", "print('hi there')"])


def test_forwarded_env_refuses_what_the_launcher_owns_and_bad_names():
    for key in sorted(OWNED_ENV):
        with pytest.raises(ValueError, match=f"env may not set {key}"):
            forwarded_env({key: "x"}, environ={})
    with pytest.raises(ValueError, match="invalid environment variable name '1X'"):
        forwarded_env({"1X": "x"}, environ={})


def test_hostfile_lines_ports_slots_and_comments(tmp_path):
    f = tmp_path / "hosts"
    f.write_text("# cluster\n10.0.0.1:2222\n10.0.0.2 slots=4  # big one\n\n10.0.0.3\n")
    got = [(e.host, e.port, e.slots) for e in read_hostfile(str(f), colon="port")]
    assert got == [("10.0.0.1", "2222", None), ("10.0.0.2", None, 4), ("10.0.0.3", None, None)]
    f.write_text("h1:3\n")  # MPICH's host:slots
    got = [(e.host, e.port, e.slots) for e in read_hostfile(str(f), colon="slots")]
    assert got == [("h1", None, 3)]
    f.write_text("10.0.0.1\n10.0.0.2:http\n")
    with pytest.raises(ValueError, match=rf"hostfile {f}, line 2: cannot parse '10.0.0.2:http'"):
        read_hostfile(str(f), colon="port")
    f.write_text(":22\n")
    with pytest.raises(ValueError, match=rf"hostfile {f}, line 1: no host"):
        read_hostfile(str(f), colon="port")


def check_hosts(path, launcher, workers, servers):
    return backend_for(launcher).check_hosts(path, workers, servers)


def test_check_hosts_names_the_file_and_what_is_missing(tmp_path):
    with pytest.raises(ValueError, match="the ssh launcher needs a hostfile"):
        check_hosts(None, "ssh", 2, 1)
    missing = tmp_path / "nope"
    with pytest.raises(ValueError, match=f"hostfile {missing} does not exist"):
        check_hosts(str(missing), "mpi", 2, 1)
    empty = tmp_path / "empty"
    empty.write_text("# only a comment\n\n")
    with pytest.raises(ValueError, match=f"hostfile {empty} lists no hosts"):
        check_hosts(str(empty), "ssh", 2, 1)
    named = tmp_path / "named"
    named.write_text("node1\nnode2\n")
    with pytest.raises(ValueError, match=r"needs IP addresses, not names \(node1, node2\)"):
        check_hosts(str(named), "ssh", 2, 1)
    assert len(check_hosts(str(named), "mpi", 2, 1)) == 2  # mpirun resolves names itself
    one = tmp_path / "one"
    one.write_text("10.0.0.1\n")
    with pytest.raises(ValueError, match=rf"hostfile {one} lists 1 host\(s\) but 2 workers"):
        check_hosts(str(one), "ssh", 2, 1)
    with pytest.raises(ValueError, match=rf"hostfile {one} provides 1 slot\(s\).*need 3"):
        check_hosts(str(one), "mpi", 3, 1)
    slots = tmp_path / "slots"
    slots.write_text("10.0.0.1 slots=3\n")
    assert len(check_hosts(str(slots), "mpi", 3, 2)) == 1


def test_a_cluster_failure_is_one_outcome_and_an_interruption_is_not_restarted():
    """The process a cluster failure is blamed on becomes the one Outcome every backend
    returns: a crash has a reason (restarted) and the kvstore rank of a server or worker; the
    launcher interrupted first (scancel, SIGTERM to salloc) or a process ended by SIGTERM,
    SIGINT or SIGHUP (Slurm cancelling the steps) has none (not restarted)."""
    from mxlarge.launcher.explain import blame as _failed

    crash = _failed(137, "worker rank 1 on h2 killed by SIGKILL", "worker", 1, 0, "h2", -9)
    f = crash.failure
    assert (crash.reason, f.role, f.kvstore_rank, f.launch_index, f.host, f.status, f.signal) \
        == ("crashed", "worker", 1, 0, "h2", -9, 9)
    scheduler = _failed(1, "scheduler exited with status 1", "scheduler", 0, None, "10.0.0.1", 1)
    assert (scheduler.reason, scheduler.failure.kvstore_rank) == ("crashed", None)
    launcher = _failed(143, "launcher received SIGTERM; job torn down", "launcher", 0, None,
                       "10.0.0.1", -15)
    f = launcher.failure
    assert (launcher.reason, f.role, f.kvstore_rank, f.launch_index, f.host) == \
        (None, "launcher", None, None, "10.0.0.1")
    for code in (130, 143, 129):
        assert _failed(code, "x", "server", 0, 0, "h1", 128 - code).reason is None


def test_listening_reads_the_namespaces_tcp_table() -> None:
    """What the scheduler-port claim waits for: a listening socket, found without binding."""
    import socket

    from mxlarge.launcher.scheduler_port import listening

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
        assert not listening(port)  # bound, not listening
        s.listen()
        assert listening(port)
    assert not listening(port)


def test_two_trackers_at_once_take_two_ports(tmp_path) -> None:
    """dmlc's PSTracker closes the port it found free before its scheduler binds it; under the
    claim a second tracker started meanwhile finds it taken (the real race: five jobs launched
    at once in tests/cluster/test_jobs.py)."""
    import threading

    from dmlc_tracker import tracker

    from mxlarge.launcher.dmlc_compat import tracker_compat
    from mxlarge.launcher.scheduler_port import claimed_scheduler_port

    # a "scheduler" that listens on its DMLC_PS_ROOT_PORT after a delay, as ps-lite's does
    # after import mxnet, and holds it for a while
    serve = (f"{sys.executable} -c \"import os, socket, time; time.sleep(0.5); "
             "s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1); "
             "s.bind(('127.0.0.1', int(os.environ['DMLC_PS_ROOT_PORT']))); s.listen(); "
             "time.sleep(1.5)\"")
    ports: list[int] = []
    with tracker_compat(), claimed_scheduler_port(tracker):
        def one() -> None:
            t = tracker.PSTracker("127.0.0.1", serve, port=9091, port_end=9999)
            ports.append(t.port)
            t.thread.join()
        threads = [threading.Thread(target=one) for _ in range(2)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    assert len(set(ports)) == 2, ports
