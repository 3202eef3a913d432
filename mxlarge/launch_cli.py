"""``mxlarge launch``: one MLflow run per job, then ps-lite roles via :mod:`mxlarge.launcher`.

argv becomes a :class:`Launch` (:func:`prepare`: the job's spec, its backend and its restart
plan, every refusal before anything starts), which :func:`run_launch` runs in the job's run;
what each attempt runs (resume, elastic world, hostfile) is the restart plan's
(:class:`~mxlarge.launcher.restart.RestartPlan`), not this module's.

Every process runs the same ``mxlarge train CONFIG ... --world PxDxSxN`` command: the scheduler
and servers run their role inside ``import mxnet`` (see :func:`mxlarge.cli._run_ps_role_if_any`),
the workers train. The job's world is decided here once (:func:`launch_config`: ``-n`` sets
``dist.workers``, ``-s`` ``dist.servers``; the command line wins over the file, so ``mxlarge show
CONFIG dist.workers=N`` prints the plan this job runs) and carried as a value: the
:class:`~mxlarge.launcher.job.JobSpec`'s ``world``, which is the workers' number of processes
and their ``--world`` (:attr:`~mxlarge.launcher.job.JobSpec.argv`). The
job's run is decided here before anything starts (:func:`mxlarge.tracking.open_run`: given
with ``--run-id`` by a caller that ends it, else the resumed checkpoint's, else a new one),
passed to every worker as ``--run-id`` with the store in ``MLFLOW_TRACKING_URI``, and ended
FINISHED or FAILED by the job's exit status (:meth:`~mxlarge.tracking.OpenRun.close`), with
the failure as tags (:meth:`~mxlarge.launcher.outcome.ProcessFailure.tags`: ``failed_role``,
``failed_kvstore_rank``, ``failed_launch_index``, ``failed_host``, ``failed_status``; and
``failed_step``), the failed process's evidence as the artifact
``failure/<role>-<kvstore rank>.log`` (``<role>-launch<index>`` while the rank is not known)
and every process's as ``failure/job.log`` (:meth:`~mxlarge.launcher.record.JobRecord.outcome`).

With ``--elastic`` (:class:`mxlarge.launcher.restart.Elastic`) each restart may run in another
world of the same global batch (the attempt's spec is the job's with that ``world``); the run
records each world as tags ``world_<attempt>`` (and ``workers_lost``) and the metric
``world/workers`` at the step the attempt starts from. A cluster job's restart after a
host is lost runs from a hostfile of the answering hosts only
(:func:`~mxlarge.launcher.backends.ssh.survivors_hostfile`,
:func:`~mxlarge.launcher.backends.mpi.survivors_hostfile`, a Slurm job's answering nodes).
"""
from __future__ import annotations

import argparse
import dataclasses
import os
import sys
import time
from pathlib import Path
from typing import Any

from mxlarge.config import Config, ConfigError, DistConfig, load_config, parse_overrides, read_yaml
from mxlarge.errors import InputError
from mxlarge.launcher.backends.base import LaunchBackend
from mxlarge.launcher.flags import elastic_of
from mxlarge.launcher.job import JobSpec, run_attempt
from mxlarge.launcher.job import attempt_spec as job_attempt_spec
from mxlarge.launcher.outcome import Outcome
from mxlarge.launcher.record import JobRecord
from mxlarge.launcher.registry import backend_for
from mxlarge.launcher.restart import Attempt, RestartPlan, RestartPolicy
from mxlarge.plan import World, with_world, world_of


def launch_config(path: str | Path, overrides: list[str], workers: int | None,
                  servers: int | None, server_hosts: str | None = None
                  ) -> tuple[Config, World, list[str]]:
    """The config and world a launched job runs, and its workers' overrides.

    The overrides are ``overrides`` and what launching adds to the config: a dist store (a
    local one would train k unsynchronised copies) and ``dist.servers`` = ``servers``, if
    given, and ``dist.server_hosts`` = ``server_hosts`` (``--server-hosts``, comma-separated),
    if given. ``workers`` (``-n``), if given, is the world's processes, put into the config as
    ``dist.workers`` (:func:`~mxlarge.plan.with_world`): the config is what ``mxlarge show``
    reads with the returned overrides and ``dist.workers=<workers>``.
    """
    # the store the file and overrides ask for, read before validating: a setting that needs a
    # dist store (dist.wire_dtype, dist.compression) must be judged with the one launching adds
    extra = [] if _kvstore_asked(path, overrides).startswith("dist") else \
        ["dist.kvstore=dist_sync"]
    if servers is not None:
        extra.append(f"dist.servers={servers}")
    if server_hosts is not None:
        hosts = [h.strip() for h in server_hosts.split(",") if h.strip()]
        if not hosts:
            raise ConfigError(f"--server-hosts {server_hosts!r}: expected HOST[,HOST...]")
        extra.append(f"dist.server_hosts=[{','.join(hosts)}]")
    overrides = [*overrides, *extra]
    cfg = load_config(path, overrides)
    world = world_of(cfg, str(path))
    if workers is not None:
        world = dataclasses.replace(world, processes=workers)
        cfg = with_world(cfg, world, "-n/--workers")
    return cfg, world, overrides


def _kvstore_asked(path: str | Path, overrides: list[str]) -> str:
    """``dist.kvstore`` as the file and ``overrides`` set it (the default without either); the
    file's and the overrides' errors are left to :func:`load_config`."""
    asked = DistConfig.kvstore
    try:
        tree = read_yaml(path) or {}
        dist = tree.get("dist") if isinstance(tree, dict) else None
        if isinstance(dist, dict) and "kvstore" in dist:
            asked = dist["kvstore"]
        for key, value in parse_overrides(overrides):
            if key == "dist.kvstore":
                asked = value
    except ConfigError:
        pass
    return str(asked)


def job_spec(args: argparse.Namespace) -> tuple[JobSpec, Config]:
    """``mxlarge launch``'s argv as the job (:class:`~mxlarge.launcher.job.JobSpec`) and the
    config its workers run: the world decided once (:func:`launch_config`), the workers'
    command ``mxlarge train CONFIG OVERRIDES...`` (to which the spec adds ``--world``).

    Raises:
        InputError: a count below its floor, an option the backend cannot apply.
    """
    from mxlarge.plan import servers_of

    for flag, value in (("-n/--workers", args.workers), ("-s/--servers", args.servers)):
        if value is not None and value < 1:
            raise ConfigError(f"{flag} = {value}: expected an integer >= 1")
    if args.max_restarts < 0:
        raise ConfigError(f"--max-restarts {args.max_restarts}: expected an integer >= 0")
    cfg, world, overrides = launch_config(args.config, list(args.overrides), args.workers,
                                          args.servers, args.server_hosts)
    if args.max_restarts and not cfg.train.checkpoint_every:
        # a restart resumes from the job's newest checkpoint: without any, it would start over
        overrides.append("train.checkpoint_every=1")
        cfg = dataclasses.replace(cfg, train=dataclasses.replace(cfg.train, checkpoint_every=1))
        print(f"mxlarge: --max-restarts {args.max_restarts}: checkpointing every epoch "
              "(train.checkpoint_every=1) so that a restart resumes from the last one",
              flush=True)
    command = (sys.executable, "-m", "mxlarge.cli", "train",
               str(Path(args.config).resolve()), *overrides)
    try:  # the job as data, before any run is created or process started
        spec = JobSpec(args.launcher, command, world, servers_of(cfg),
                       stall_timeout=args.stall_timeout, tuning=not args.no_tuning,
                       firewall=args.firewall, port=args.port, hostfile=args.hostfile,
                       pass_world=True, server_hosts=cfg.dist.server_hosts)
    except ValueError as exc:
        raise InputError(str(exc)) from None
    return spec, cfg


def launch(args: argparse.Namespace) -> int:
    """``mxlarge launch``: argv as a job (:func:`prepare`: the spec, its backend and its
    restart plan, every refusal before anything starts), then :func:`run_launch`."""
    return run_launch(prepare(args))


@dataclasses.dataclass
class Launch:
    """A launch as :func:`prepare` decided it from argv; :func:`run_launch` runs it.

    Attributes:
        spec: the job (its attempts are :func:`attempt_spec` of it).
        backend: the spec's backend.
        restarts: what each attempt runs (:class:`~mxlarge.launcher.restart.RestartPlan`).
        cfg: the config the workers run; ``plan`` its plan in the spec's world.
        meta: the ``--resume`` checkpoint's metadata (its run), if one was given.
        run_id: ``--run-id``: a run of the caller's, which the job logs into.
        config: the config file.
    """

    spec: JobSpec
    backend: LaunchBackend
    restarts: RestartPlan
    cfg: Config
    plan: Any
    meta: dict[str, Any] | None
    run_id: str | None
    config: str


def prepare(args: argparse.Namespace) -> Launch:
    """``mxlarge launch``'s argv as a :class:`Launch`: the spec (:func:`job_spec`), a plan
    that can run (world, batch, model), the hostfile as its backend reads it, ``--elastic``'s
    world keeper, the firewall and port checks and the ``--resume`` checkpoint, and the
    restart plan over them (:class:`~mxlarge.launcher.restart.RestartPlan`).

    Raises:
        InputError: anything that cannot run, before any run is created or process started.
    """
    from mxlarge import launcher
    from mxlarge.launcher.job import firewall_refusal
    from mxlarge.plan import check_timeline, plan_for

    spec, cfg = job_spec(args)
    workers = spec.world.processes
    servers = spec.servers
    # Fail on a job that cannot run (world, batch, model, timeline) before starting any process.
    plan = plan_for(cfg, args.config, world=spec.world)
    check_timeline(cfg, plan.total_steps, args.config)
    backend = backend_for(spec.launcher)
    try:
        lines = backend.check_hosts(args.hostfile, workers, servers, spec.server_hosts)
    except ValueError as exc:
        raise InputError(str(exc)) from None
    elastic = elastic_of(args, backend, plan.world, servers, lines)
    from mxlarge.nets import build_net
    build_net(cfg.model, cfg.data.num_classes)  # an unknown model fails here, not in 3 workers

    why = firewall_refusal(args.launcher, args.firewall)
    if why:
        raise InputError(f"--firewall on: {why}")
    from mxlarge.launcher.preflight import HostCheckError
    try:
        backend.preflight(spec)
    except (launcher.PortInUseError, HostCheckError) as exc:
        raise InputError(str(exc)) from None
    meta = None
    path = None
    if args.resume is not None:
        from mxlarge import checkpoint
        from mxlarge.config import checkpoint_root
        path = checkpoint.resolve(args.resume, checkpoint_root(cfg)).resolve()
        meta = checkpoint.read_meta(path)
        checkpoint.check_world(path, meta, plan.world)
    started = time.time()

    def latest() -> Path | None:  # a restart resumes from the newest checkpoint of this job
        from mxlarge import checkpoint
        from mxlarge.config import checkpoint_root
        return checkpoint.find_latest(checkpoint_root(cfg), since=started)

    restarts = RestartPlan(
        RestartPolicy(args.max_restarts), plan.world, servers, elastic=elastic, resume=path,
        latest=latest, servers_of=lambda world: cfg.dist.servers or world.processes,
        hostfile_of=lambda e, s, w: backend.attempt_hostfile(lines, e, servers, s, w))
    return Launch(spec, backend, restarts, cfg, plan, meta, args.run_id, args.config)


def attempt_spec(job: Launch, attempt: Attempt) -> JobSpec:
    """The spec of one attempt (:func:`mxlarge.launcher.job.attempt_spec`), resuming from the
    attempt's checkpoint."""
    spec = job.spec
    if attempt.resume is not None:
        spec = dataclasses.replace(spec, command=(*spec.command, "--resume", str(attempt.resume)))
    return job_attempt_spec(spec, attempt)


def run_launch(job: Launch) -> int:
    """Runs a prepared launch in its MLflow run (:func:`mxlarge.tracking.open_run`: given with
    ``--run-id``, else the resumed checkpoint's, else a new one), every attempt the restart
    plan grants, and ends the run FINISHED or FAILED with the failure's tags; returns the exit
    code."""
    from mxlarge import launcher, tracking
    from mxlarge.launcher.firewall import FirewallError

    # the job's run, decided here once; the workers get its id as a value on their command
    # line (remote processes cannot be handed a Python object)
    opened = tracking.open_run(job.cfg, given=job.run_id,
                               resumed=(job.meta or {}).get("run_id"), plan=job.plan,
                               source=job.config)
    run = opened.run if opened is not None else None
    if run is not None:
        run.tag({"launcher": job.spec.launcher, "servers": job.spec.servers})
        job.spec = dataclasses.replace(job.spec, command=(*job.spec.command, "--run-id",
                                                          run.run_id),
                                       env={"MLFLOW_TRACKING_URI": run.uri})
        print(f"mxlarge: MLflow run {run.run_id} in {run.uri}", flush=True)
    print(f"mxlarge: job: {job.plan.world.describe()}, peak LR {job.plan.peak_lr:.6g}, "
          f"{job.plan.total_steps} steps", flush=True)
    if job.plan.lr_note:
        print(f"mxlarge: note: {job.plan.lr_note}", flush=True)
    record = JobRecord(run)
    ok = False
    status = "FAILED"
    sampler = None
    if run is not None and job.backend.on_this_machine:
        run.tag({tracking.SAMPLED_BY: "launcher"})
        sampler = tracking.system_metrics(run, os.getpid())
    try:
        try:
            outcome = job.restarts.run(lambda attempt: _run_attempt(job, attempt, record),
                                       lambda line: print(f"mxlarge: {line}", flush=True),
                                       record.restart)
        except (launcher.PortInUseError, ValueError, NotImplementedError,
                FileNotFoundError, FirewallError) as exc:
            record.end_tags["failure"] = str(exc)
            raise InputError(str(exc)) from None
        ok = outcome.exit_code == 0
        status = record.status(outcome)
        record.outcome(outcome)
        if not ok:
            print(f"mxlarge: job failed: {outcome.message}", file=sys.stderr, flush=True)
        return outcome.exit_code
    finally:
        if sampler is not None:
            sampler.finish()
        if opened is not None:
            opened.close(ok, record.end_tags, status)
            if opened.owned:
                owned = opened.run
                print(f"mxlarge: MLflow run {owned.run_id} {status}: "
                      f"{tracking.ui_hint(owned.uri, owned.run_id)}", flush=True)


def _run_attempt(job: Launch, attempt: Attempt, record: JobRecord) -> Outcome:
    """One attempt: its lines, its world in the run, run (from its own hostfile, if any)
    with its ranks' picture drawn in the run while it runs and at its end."""
    number = attempt.number
    if number:
        print(f"mxlarge: restart {number}: " + (f"resuming from {attempt.resume}"
              if attempt.resume else "from the start (no checkpoint yet)"), flush=True)
    if attempt.new_world:
        record.world(attempt)
    if attempt.world != job.spec.world:
        print(f"mxlarge: restart {number}: world {attempt.world.describe()} (lost: "
              f"{', '.join(attempt.lost)})", flush=True)
    outcome = run_attempt(attempt_spec(job, attempt), attempt,
                          lambda line: print(f"mxlarge: {line}", flush=True),
                          drawn=record.breakdown)
    record.attempt(outcome)
    return outcome
