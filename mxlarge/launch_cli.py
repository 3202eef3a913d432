"""``mxlarge launch``: one MLflow run per job, then ps-lite roles via :mod:`mxlarge.launcher`.

Every process runs the same ``mxlarge train CONFIG ...`` command: the scheduler and servers run
their role inside ``import mxnet`` (see :func:`mxlarge.cli._run_ps_role_if_any`), the workers
train. The run is created here before anything starts, passed to all processes through
``MXLARGE_RUN_ID`` and ``MLFLOW_TRACKING_URI``, and ended FINISHED or FAILED by the job's exit
status, with the failing role/rank as a tag.
"""
from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

from mxlarge.config import Config, ConfigError, load_config
from mxlarge.launcher.local import Outcome
from mxlarge.launcher.restart import (
    Failure,
    RestartPolicy,
    cluster_outcome,
    latest_checkpoint,
    run_with_restarts,
)


def _abs_sqlite(uri: str) -> str:
    """Workers may start in another directory: make a relative sqlite path absolute."""
    prefix = "sqlite:///"
    if uri.startswith(prefix) and not uri[len(prefix):].startswith("/"):
        return prefix + str(Path(uri[len(prefix):]).resolve())
    return uri


def launch_overrides(cfg: Config, workers: int, servers: int) -> list[str]:
    """What launching adds to a config: a dist store and the world it runs in."""
    # launching means distributed: a local store would train k unsynchronised copies
    extra = [] if cfg.dist.kvstore.startswith("dist") else ["dist.kvstore=dist_sync"]
    return [*extra, f"dist.workers={workers}", f"dist.servers={servers}"]


def launch(args: argparse.Namespace) -> int:
    from mxlarge import launcher

    overrides = list(args.overrides)
    cfg = load_config(args.config, overrides)
    workers = cfg.dist.workers if args.workers is None else args.workers
    servers = cfg.dist.servers if args.servers is None else args.servers
    if workers < 1:
        raise ConfigError(f"-n/--workers = {workers}: expected an integer >= 1")
    if servers < 1:
        raise ConfigError(f"-s/--servers = {servers}: expected an integer >= 1")
    overrides += launch_overrides(cfg, workers, servers)
    if args.max_restarts < 0:
        raise ConfigError(f"--max-restarts {args.max_restarts}: expected an integer >= 0")
    if args.max_restarts and not cfg.train.checkpoint_every:
        # a restart resumes from the job's newest checkpoint: without any, it would start over
        overrides.append("train.checkpoint_every=1")
        print(f"mxlarge: --max-restarts {args.max_restarts}: checkpointing every epoch "
              "(train.checkpoint_every=1) so that a restart resumes from the last one",
              flush=True)
    cfg = load_config(args.config, overrides)
    # Fail on a batch that cannot fit before starting any process.
    if cfg.data.train_samples is None:
        from mxlarge.data import train_size
        samples = train_size(cfg.data)
    else:
        samples = cfg.data.train_samples
    from mxlarge.config import derive
    derive(cfg, workers * cfg.dist.simulate_workers, samples, args.config)
    from mxlarge.nets import build_net
    build_net(cfg.model, cfg.data.num_classes)  # an unknown model fails here, not in 3 workers

    if args.launcher in launcher.UNSUPPORTED:
        raise ConfigError(f"--launcher {args.launcher}: {launcher.UNSUPPORTED[args.launcher]}")
    if args.launcher in ("ssh", "mpi"):
        try:
            launcher.cluster.check_hosts(args.hostfile, args.launcher, workers, servers)
        except ValueError as exc:
            raise ConfigError(str(exc)) from None
    if args.launcher == "local" and args.port is not None:
        try:  # before any run is created or process started
            launcher.local.ensure_port_free(args.port)
        except launcher.PortInUseError as exc:
            raise ConfigError(str(exc)) from None
    command = [sys.executable, "-m", "mxlarge.cli", "train",
               str(Path(args.config).resolve()), *overrides]
    meta = path = None
    if args.resume is not None:
        from mxlarge import checkpoint
        from mxlarge.config import checkpoint_root
        path = checkpoint.resolve(args.resume, checkpoint_root(cfg)).resolve()
        meta = checkpoint.read_meta(path)
        saved = meta["layout"]
        if saved["workers"] != workers:
            raise checkpoint.CheckpointError(
                f"{path}: written by {saved['workers']} worker(s), launching {workers}: refused "
                "(the global batch, LR schedule, data shards and per-worker BN statistics "
                "depend on the world size); relaunch with the same -n")
    env: dict[str, str] = {}
    run_id = uri = None
    if cfg.tracking.enabled:
        from mxlarge import tracking
        uri = _abs_sqlite(tracking.tracking_uri(cfg))
        tracking.check_reachable(uri)
        if meta is not None and meta.get("run_id"):
            run_id = meta["run_id"]
            tracking.reopen_run(uri, run_id)
        else:
            run_id = tracking.create_run(cfg, uri, {
                "launcher": args.launcher, "world_size": workers, "servers": servers,
                "kvstore": cfg.dist.kvstore})
        env.update(MXLARGE_RUN_ID=run_id, MLFLOW_TRACKING_URI=uri)
        print(f"mxlarge: MLflow run {run_id} in {uri}", flush=True)
    ok = False
    fail_tags: dict[str, str] = {}
    started = time.time()

    def attempt(number: int) -> Outcome:
        resume = path
        if number:
            from mxlarge.config import checkpoint_root
            resume = latest_checkpoint(checkpoint_root(cfg), started) or path
            print(f"mxlarge: restart {number}: " + (f"resuming from {resume}" if resume else
                  "from the start (no checkpoint yet)"), flush=True)
        cmd = command if resume is None else [*command, "--resume", str(resume)]
        if args.launcher == "local":
            return launcher.run_local(cmd, workers=workers, servers=servers, port=args.port,
                                      env=env, stall_timeout=args.stall_timeout)
        return cluster_outcome(launcher.cluster_submit(
            args.launcher, cmd, workers=workers, servers=servers, hostfile=args.hostfile,
            env=env, stall_timeout=args.stall_timeout), args.launcher)

    def record(failure: Failure, restarts: int, gave_up: str | None) -> None:
        if run_id is None:
            return
        from mxlarge import tracking
        tags: dict[str, object] = {"restarts": restarts}
        if gave_up is None:
            tags[f"restart_{restarts}_reason"] = failure.message
        else:
            tags["restart_gave_up"] = gave_up
        tracking.set_tags(uri, run_id, tags)
        tracking.log_metrics(uri, run_id, {"restarts": restarts}, failure.step or 0)

    try:
        try:
            outcome = run_with_restarts(
                attempt, RestartPolicy(args.max_restarts),
                lambda line: print(f"mxlarge: {line}", flush=True), record)
        except launcher.PortInUseError as exc:
            fail_tags = {"failure": str(exc)}
            raise ConfigError(str(exc)) from None
        except (ValueError, NotImplementedError, FileNotFoundError) as exc:
            fail_tags = {"failure": str(exc)}
            raise ConfigError(str(exc)) from None
        ok = outcome.exit_code == 0
        if not ok:
            fail_tags = {"failure": outcome.message}
            if outcome.failed_role is not None:
                fail_tags.update(failed_role=outcome.failed_role,
                                 failed_rank=str(outcome.failed_rank),
                                 failed_status=str(outcome.failed_status))
            if outcome.reason == "stalled":
                fail_tags.update(failure="stalled", failure_detail=outcome.message)
            print(f"mxlarge: job failed: {outcome.message}", file=sys.stderr, flush=True)
        return outcome.exit_code
    finally:
        if run_id is not None:
            from mxlarge import tracking
            tracking.end_run(uri, run_id, ok, fail_tags)
            status = "FINISHED" if ok else "FAILED"
            print(f"mxlarge: MLflow run {run_id} {status} "
                  f"(mlflow ui --backend-store-uri {uri})", flush=True)
