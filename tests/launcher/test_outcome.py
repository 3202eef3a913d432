"""The one failure record: its name and tags (what a launch writes into its MLflow run), and the
tags of runs recorded before ``failed_rank`` was split, read in today's names."""
from mxlarge.launcher.outcome import Outcome, ProcessFailure, failure_tags


def test_a_failure_names_the_kvstore_rank_and_the_launch_index_apart():
    f = ProcessFailure("worker", kvstore_rank=1, launch_index=0, host="h2", pid=42, status=-9,
                       step=7, output=("last",))
    assert (f.signal, f.name) == (9, "worker-1")
    assert f.tags() == {"failed_role": "worker", "failed_kvstore_rank": "1",
                        "failed_launch_index": "0", "failed_host": "h2", "failed_pid": "42",
                        "failed_status": "-9"}
    server = ProcessFailure("server", launch_index=1, status=3)
    assert (server.signal, server.name) == (None, "server-launch1")
    assert server.tags() == {"failed_role": "server", "failed_launch_index": "1",
                             "failed_status": "3"}
    assert ProcessFailure("launcher", host="10.0.0.1").name == "launcher"
    assert Outcome(0, "done").failure is None


def test_old_runs_failed_rank_reads_as_the_launch_index_or_the_kvstore_rank():
    """Before the split a local job's ``failed_rank`` was the launch index, a cluster job's
    the kvstore rank (0 for the scheduler and the launcher: no rank at all)."""
    local = {"launcher": "local", "failed_role": "worker", "failed_rank": "1",
             "failed_kvstore_rank": "0", "failed_host": "box"}
    assert failure_tags(local) == {"failed_role": "worker", "failed_launch_index": "1",
                                   "failed_kvstore_rank": "0", "failed_host": "box"}
    ssh = {"launcher": "ssh", "failed_role": "server", "failed_rank": "1", "failed_host": "h2"}
    assert failure_tags(ssh) == {"failed_role": "server", "failed_kvstore_rank": "1",
                                 "failed_host": "h2"}
    cancelled = {"launcher": "slurm", "failed_role": "launcher", "failed_rank": "0"}
    assert failure_tags(cancelled) == {"failed_role": "launcher"}
    unknown = {"launcher": "mpi", "failed_role": "worker", "failed_rank": "None"}
    assert failure_tags(unknown) == {"failed_role": "worker"}
    now = ProcessFailure("worker", 1, 0, "h2").tags()
    assert failure_tags({"launcher": "ssh", **now}) == now
