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
from pathlib import Path

from mxlarge.config import Config, ConfigError, load_config
from mxlarge.launcher.watchdog import STALL_EXIT


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
    meta = None
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
        command += ["--resume", str(path)]
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
    try:
        if args.launcher == "local":
            try:
                outcome = launcher.run_local(command, workers=workers, servers=servers,
                                             port=args.port, env=env,
                                             stall_timeout=args.stall_timeout)
            except launcher.PortInUseError as exc:
                fail_tags = {"failure": str(exc)}
                raise ConfigError(str(exc)) from None
            ok = outcome.exit_code == 0
            if not ok:
                fail_tags = {"failed_role": str(outcome.failed_role),
                             "failed_rank": str(outcome.failed_rank),
                             "failed_status": str(outcome.failed_status),
                             "failure": outcome.message}
                if outcome.reason == "stalled":
                    fail_tags.update(failure="stalled", failure_detail=outcome.message)
                print(f"mxlarge: job failed: {outcome.message}", file=sys.stderr, flush=True)
            code = outcome.exit_code
        else:
            try:
                code = launcher.cluster_submit(args.launcher, command, workers=workers,
                                               servers=servers, hostfile=args.hostfile, env=env,
                                               stall_timeout=args.stall_timeout)
            except (ValueError, NotImplementedError, FileNotFoundError) as exc:
                fail_tags = {"failure": str(exc)}
                raise ConfigError(str(exc)) from None
            ok = code == 0
            if not ok:
                fail_tags = {"failure": "stalled" if code == STALL_EXIT
                             else f"{args.launcher} job exited with {code}"}
                print(f"mxlarge: job failed with exit code {code}", file=sys.stderr, flush=True)
        return 0 if ok else (code if code else 1)
    finally:
        if run_id is not None:
            from mxlarge import tracking
            tracking.end_run(uri, run_id, ok, fail_tags)
            status = "FINISHED" if ok else "FAILED"
            print(f"mxlarge: MLflow run {run_id} {status} "
                  f"(mlflow ui --backend-store-uri {uri})", flush=True)
