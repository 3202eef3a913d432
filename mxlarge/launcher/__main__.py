"""``python -m mxlarge.launcher -n 2 -s 1 [--launcher ssh -H hosts] [--server-hosts H,...]
[--stall-timeout S] [--max-restarts N [--elastic]] [--experiment E] [--run-name R]
[--no-mlflow] -- CMD ...``: your own training script as a job, in one MLflow run.

The run is decided here, before anything starts (:func:`mxlarge.tracking.open_command_run`:
``$MLFLOW_RUN_ID``'s, else a new one), and reaches the workers as MLflow's own convention
has it: ``MLFLOW_TRACKING_URI`` and ``MLFLOW_RUN_ID`` in their environment, so that a
script's own ``mlflow.log_metric`` lands in it. It holds the world as params, each
attempt's hosts, stragglers and timeline, and ends FINISHED, FAILED (the failed process's
tags and evidence, as a ``mxlarge launch`` run) or KILLED (stopped with Ctrl-C)
(:class:`~mxlarge.launcher.record.JobRecord`).

With ``--elastic`` a restart may run in a smaller world of the same units (2 workers → 1
worker × 2 simulated workers); the command learns it from
:data:`~mxlarge.plan.SIMULATED_ENV` through its Trainer, computes each of
``trainer.units()`` and resumes through :mod:`mxlarge.resume`."""
from __future__ import annotations

import argparse
import dataclasses
import json
import os
import shlex
import sys
from typing import Any

from mxlarge.errors import InputError
from mxlarge.launcher.backends.local import PortInUseError
from mxlarge.launcher.firewall import FirewallError
from mxlarge.launcher.flags import add_elastic_flags, add_job_flags, elastic_of
from mxlarge.launcher.job import JobSpec, attempt_spec, firewall_refusal, run_attempt
from mxlarge.launcher.outcome import Outcome
from mxlarge.launcher.record import JobRecord
from mxlarge.launcher.registry import backend_for
from mxlarge.launcher.restart import Attempt, RestartPlan, RestartPolicy
from mxlarge.plan import World
from mxlarge.timeline import ENV as TIMELINE_ENV
from mxlarge.timeline import TimelineWindow

#: Where a job's merged timeline goes with ``--no-mlflow`` (:mod:`mxlarge.timeline`).
TIMELINE_FILE = "mxlarge-timeline.json"


def _env_pair(text: str) -> tuple[str, str]:
    key, sep, value = text.partition("=")
    if not sep or not key:
        raise argparse.ArgumentTypeError(f"expected KEY=VALUE, got {text!r}")
    return key, value


def _parser() -> argparse.ArgumentParser:
    from mxlarge import __version__

    p = argparse.ArgumentParser(prog="python -m mxlarge.launcher",
                                description="Run a command as an MXNet dist_sync job, in one "
                                            "MLflow run.")
    p.add_argument("--version", action="version", version=f"mxlarge {__version__}")
    p.add_argument("-n", "--workers", type=int, required=True)
    add_job_flags(p, servers="number of servers (default: as many as workers)",
                  restarts="after a failure (crash, kill, stall) run the whole job again, up to "
                           "N times; the command resumes from its own checkpoints "
                           "(mxlarge.resume)")
    add_elastic_flags(p)
    p.add_argument("--server-hosts", default=None, metavar="HOST[,HOST...]",
                   help="ssh/mpi/slurm: hosts that run servers only (one server each)")
    p.add_argument("--host-ip", default=None,
                   help="address of the scheduler for cluster launchers (dmlc --host-ip)")
    p.add_argument("--env", type=_env_pair, action="append", default=[], metavar="KEY=VALUE",
                   help="extra environment for every process (repeatable)")
    p.add_argument("--grace", type=float, default=10.0,
                   help="seconds between SIGTERM and SIGKILL on teardown")
    p.add_argument("--experiment", default=None,
                   help="MLflow experiment (default: $MLFLOW_EXPERIMENT_NAME, else the "
                        "script's file name)")
    p.add_argument("--run-name", default=None, help="MLflow run name (default: the script's "
                                                    "file name)")
    p.add_argument("--no-mlflow", action="store_true",
                   help="no MLflow run (a timeline goes to ./mxlarge-timeline.json)")
    p.add_argument("command", nargs=argparse.REMAINDER, help="-- CMD ARGS...")
    return p


def _spec(p: argparse.ArgumentParser, a: argparse.Namespace,
          command: list[str]) -> tuple[JobSpec, RestartPlan]:
    """The job as argv asks for it, and its restart plan; every refusal before anything
    starts."""
    if a.max_restarts < 0:
        p.error(f"--max-restarts {a.max_restarts}: expected an integer >= 0")
    hosts = () if a.server_hosts is None else tuple(
        h.strip() for h in a.server_hosts.split(",") if h.strip())
    if a.server_hosts is not None and not hosts:
        p.error(f"--server-hosts {a.server_hosts!r}: expected HOST[,HOST...]")
    backend = backend_for(a.launcher)
    try:  # the world of a command of the user's own is its processes only (no --world added)
        spec = JobSpec(a.launcher, tuple(command), World(processes=a.workers),
                       a.workers if a.servers is None else a.servers, env=dict(a.env),
                       stall_timeout=a.stall_timeout, tuning=not a.no_tuning,
                       firewall=a.firewall, port=a.port, hostfile=a.hostfile,
                       host_ip=a.host_ip, grace=a.grace, server_hosts=hosts)
        lines = backend.check_hosts(a.hostfile, a.workers, spec.servers, hosts)
        elastic = elastic_of(a, backend, spec.world, spec.servers, lines)
    except (ValueError, InputError) as e:
        p.error(str(e))
    why = firewall_refusal(a.launcher, a.firewall)
    if why:
        p.error(f"--firewall on: {why}")
    window = dict(a.env).get(TIMELINE_ENV, os.environ.get(TIMELINE_ENV))
    if window:  # a window the workers would refuse is refused before anything starts
        try:
            TimelineWindow.parse(window)
        except ValueError as e:
            p.error(str(e))
    servers = a.servers
    plan = RestartPlan(RestartPolicy(a.max_restarts), spec.world, spec.servers,
                       elastic=elastic,
                       servers_of=lambda world: servers or world.processes,
                       hostfile_of=lambda e, s, w: backend.attempt_hostfile(
                           lines, e, spec.servers, s, w))
    return spec, plan


def _params(spec: JobSpec) -> dict[str, Any]:
    """The world as the run's params: what the launcher knows without the script's help."""
    return {"workers": spec.world.processes, "servers": spec.servers,
            "server_hosts": ",".join(spec.server_hosts) or "co-located",
            "launcher": spec.launcher, "command": shlex.join(spec.command)[:6000]}


def main(argv: list[str] | None = None) -> int:
    """Parse ``argv``, run the job in its run, return its exit code."""
    p = _parser()
    a = p.parse_args(argv)
    command = a.command[1:] if a.command[:1] == ["--"] else a.command
    if not command:
        p.error("no command given (put it after --)")
    spec, restarts = _spec(p, a, command)
    try:
        backend_for(a.launcher).preflight(spec)  # every host answers, before anything starts
        opened = None
        if not a.no_mlflow:
            from mxlarge import tracking
            opened = tracking.open_command_run(command, _params(spec),
                                               experiment=a.experiment, name=a.run_name)
            run = opened.run
            spec = dataclasses.replace(spec, env={**spec.env, "MLFLOW_TRACKING_URI": run.uri,
                                                  "MLFLOW_RUN_ID": run.run_id})
            print(f"[launcher] MLflow run {run.run_id} in {run.uri}", flush=True)
        return _run(spec, restarts, opened)
    except (ValueError, PortInUseError, NotImplementedError, FileNotFoundError,
            FirewallError) as e:
        print(f"mxlarge.launcher: error: {e}", file=sys.stderr)  # incl. an unusable store
        return 2


def _run(spec: JobSpec, restarts: RestartPlan, opened: Any) -> int:
    """Every attempt the restart plan grants, recorded into the run (if any), which ends
    with the job's status."""
    run = opened.run if opened is not None else None
    record = JobRecord(run)
    status = "FAILED"
    sampler = None
    if run is not None and backend_for(spec.launcher).on_this_machine:
        from mxlarge import tracking
        run.tag({tracking.SAMPLED_BY: "launcher"})
        sampler = tracking.system_metrics(run, os.getpid())  # the job's processes' CPU, memory

    def emit(line: str) -> None:
        print(f"[launcher] {line}", flush=True)

    def attempt(a: Attempt) -> Outcome:
        if a.new_world:
            record.world(a, config=False)
        if a.world != spec.world:
            emit(f"restart {a.number}: world {a.world.shape()} (lost: {', '.join(a.lost)})")
        outcome = run_attempt(attempt_spec(spec, a), a, emit, drawn=record.breakdown)
        record.attempt(outcome)
        if run is None and outcome.timeline is not None:  # no run to log it in: a file
            path = os.path.abspath(TIMELINE_FILE)
            with open(path, "w") as f:
                json.dump(outcome.timeline, f)
            emit(f"timeline: {path} (open it in https://ui.perfetto.dev)")
        return outcome

    try:
        outcome = restarts.run(attempt, emit, record.restart)
        status = record.status(outcome)
        record.outcome(outcome)
        return outcome.exit_code
    finally:
        if sampler is not None:
            sampler.finish()
        if opened is not None:
            opened.close(status == "FINISHED", record.end_tags, status)
            if opened.owned:
                from mxlarge import tracking
                owned = opened.run
                print(f"[launcher] MLflow run {owned.run_id} {status}: "
                      f"{tracking.ui_hint(owned.uri, owned.run_id)}", flush=True)


if __name__ == "__main__":
    sys.exit(main())
