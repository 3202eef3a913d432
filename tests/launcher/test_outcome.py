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


def test_a_silent_failure_has_evidence_and_a_step_from_the_heartbeats():
    """A cluster backend's blame carries no step (mpirun/srun report only the exit): the step
    comes from the failed rank's last heartbeat, else from every worker's; a process that
    printed nothing still leaves the launcher's view and every process's lines."""
    from mxlarge.launcher.outcome import LastBeat, Tail, failure_log, job_log, last_completed_step

    beats = (LastBeat(0, "h1", 10, 45, "train", 0.2, 0.1), LastBeat(1, "h2", 11, 44, "evaluating",
                                                             3.5, 3.0))
    tails = (Tail("worker 0", None, ("step 44/50 loss=0.1",)), Tail("worker 1", -9, ()))
    failed = ProcessFailure("worker", kvstore_rank=1, launch_index=1, host="h2", pid=11,
                            status=-9)
    out = Outcome(137, "worker rank 1 on h2 killed by SIGKILL", "crashed", None, failed,
                  beats=beats, tails=tails)
    assert last_completed_step(out) == 44
    unknown = Outcome(137, "m", "crashed", None, ProcessFailure("server"), beats=beats)
    assert last_completed_step(unknown) == 44  # every worker had completed 44
    assert last_completed_step(Outcome(1, "m", "crashed", 7, failed, beats=beats)) == 7
    assert last_completed_step(Outcome(1, "m")) is None
    assert failure_log(out).splitlines() == [
        "# worker rank 1 on h2 killed by SIGKILL; its last 0 line(s) of output (stdout and "
        "stderr) follow the launcher's view",
        "# its last heartbeat: worker rank 1 on h2 (pid 11): step 44, phase evaluating, "
        "changed 3.5 s ago, last heartbeat 3.0 s ago",
        "# meanwhile worker rank 0 on h1 (pid 10): step 45, phase train, changed 0.2 s ago, "
        "last heartbeat 0.1 s ago",
        "# every process's last lines: failure/job.log",
        "# (it printed nothing on stdout or stderr)"]
    job = job_log(out)
    assert "## [worker 0] still running; its last 1 line(s) of output:\nstep 44/50" in job
    assert "## [worker 1] killed by signal 9; its last 0 line(s) of output: none" in job
