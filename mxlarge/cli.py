"""``mxlarge``: a few verbs, each a thin layer over the library.

    mxlarge train  CONFIG [key=value ...]          train in this process (or as one launched rank)
    mxlarge show   CONFIG [key=value ...] [--json] [--lr-at 0,10,...]
    mxlarge launch CONFIG -n K [-s S] [--launcher local|ssh|mpi|slurm|yarn|sge] [-H HOSTFILE]

Exit status: 0 done, 1 training failed, 2 bad input (config, arguments, files).
"""
from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Sequence


def _run_ps_role_if_any() -> None:
    """A ps-lite scheduler or server runs its role inside ``import mxnet`` and exits there.

    This must happen before anything else is imported: MXNet is half-initialised in that role
    (``mxnet.gluon``, gluoncv and mlflow are not importable there).
    """
    if os.environ.get("DMLC_ROLE") in ("scheduler", "server"):
        import mxnet  # noqa: F401  (runs the role, then sys.exit())
        sys.exit(0)


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="mxlarge", description=__doc__.split("\n\n")[0])
    sub = p.add_subparsers(dest="verb", required=True)

    t = sub.add_parser("train", help="train per an experiment YAML")
    t.add_argument("config")
    t.add_argument("overrides", nargs="*", metavar="key=value")
    t.add_argument("--resume", nargs="?", const="latest", default=None, metavar="latest|PATH",
                   help="continue from a checkpoint (default: the latest of train.checkpoint_dir)")

    s = sub.add_parser("show", help="print the resolved config and derived numbers")
    s.add_argument("config")
    s.add_argument("overrides", nargs="*", metavar="key=value")
    s.add_argument("--json", action="store_true", help="machine-readable output")
    s.add_argument("--lr-at", default="", help="comma-separated steps to print the LR at")

    la = sub.add_parser("launch", help="run CONFIG as a dist_sync job (scheduler, servers, "
                                       "workers)")
    la.add_argument("config")
    la.add_argument("overrides", nargs="*", metavar="key=value")
    la.add_argument("-n", "--workers", type=int, default=None,
                    help="worker processes (default: dist.workers of the config)")
    la.add_argument("-s", "--servers", type=int, default=None,
                    help="server processes (default: dist.servers of the config)")
    la.add_argument("--launcher", default="local",
                    choices=["local", "ssh", "mpi", "slurm", "yarn", "sge"])
    la.add_argument("-H", "--hostfile", default=None)
    la.add_argument("--port", type=int, default=None, help="scheduler port (default: a free one)")
    la.add_argument("--resume", nargs="?", const="latest", default=None, metavar="latest|PATH",
                    help="continue from a checkpoint (default: the latest of "
                         "train.checkpoint_dir)")
    from mxlarge.launcher.watchdog import STALL_HELP, stall_seconds
    la.add_argument("--stall-timeout", type=stall_seconds, default=None, metavar="SECONDS",
                    help=STALL_HELP)
    la.add_argument("--max-restarts", type=int, default=0, metavar="N",
                    help="after a failure (crash, kill, stall) relaunch the whole job from its "
                         "newest checkpoint, up to N times, in the same MLflow run (turns on "
                         "train.checkpoint_every=1 if checkpoints are off); see "
                         "mxlarge/launcher/restart.py")

    sw = sub.add_parser("sweep", help="run a sweep file's grid of labelled runs x seeds "
                                      "(resumable; see mxlarge/sweep.py)")
    sw.add_argument("sweep")
    sw.add_argument("overrides", nargs="*", metavar="key=value")
    sw.add_argument("--dry-run", action="store_true", help="list the cells and which are done")

    r = sub.add_parser("report", help="markdown table and plots of a sweep's runs, logged to a "
                                      "summary MLflow run")
    r.add_argument("name", help="the sweep name (tag sweep=NAME)")
    r.add_argument("--out", default=None, help="output directory (default: reports/NAME)")
    r.add_argument("--target-fraction", type=float, default=0.99,
                   help="target = this x the best validation accuracy in the sweep")
    r.add_argument("--experiment", default="mxlarge", help="MLflow experiment")
    return p


def _show(args: argparse.Namespace) -> int:
    from mxlarge import schedulers
    from mxlarge.config import derive, dump_yaml, to_dict

    cfg = _load(args)
    samples = cfg.data.train_samples
    if samples is None:
        from mxlarge.data import train_size
        samples = train_size(cfg.data)
    d = derive(cfg, cfg.dist.workers * cfg.dist.simulate_workers, samples, args.config)
    sched = schedulers.from_config(cfg, d)
    try:
        steps = [int(x) for x in args.lr_at.split(",") if x.strip()]
    except ValueError:
        raise SystemExit(_fail(f"--lr-at {args.lr_at!r}: expected comma-separated integers",
                               2)) from None
    if any(s < 0 for s in steps):
        raise SystemExit(_fail(f"--lr-at {args.lr_at!r}: steps must be >= 0", 2))
    roles = _role_counts(cfg)
    out = {
        "config": to_dict(cfg),
        "derived": {
            "workers": cfg.dist.workers, "simulated_workers": cfg.dist.simulate_workers,
            "devices_per_worker": cfg.dist.devices, "per_device_batch": cfg.data.batch_size,
            "global_batch": d.global_batch, "train_samples": d.train_samples,
            "steps_per_epoch": d.steps_per_epoch, "total_steps": d.total_steps,
            "peak_lr": d.peak_lr, "warmup_lr": d.warmup_lr, "warmup_steps": d.warmup_steps,
            "decay_steps": list(d.decay_steps),
            "lr_at": {str(s): sched(s) for s in steps},
        },
        "param_roles": roles,
    }
    if args.json:
        print(json.dumps(out, indent=2))
        return 0
    print(dump_yaml(cfg).rstrip())
    print("---")
    for k, v in out["derived"].items():
        if k == "lr_at":
            for s, lr in v.items():
                print(f"lr at step {s}: {lr:.6g}")
        else:
            print(f"{k}: {v}")
    for k, v in roles.items():
        print(f"params {k}: {v}")
    return 0


def _role_counts(cfg) -> dict[str, int]:
    """Builds the net (no data needed) to count parameter roles."""
    import mxnet as mx

    from mxlarge import nets
    from mxlarge.kvstore.roles import param_roles, role_counts

    shape = {"digits": (1, 8, 8), "cifar10": (3, 32, 32)}.get(
        cfg.data.dataset, (3, cfg.data.image_size, cfg.data.image_size))
    net = nets.build_net(cfg.model, cfg.data.num_classes)
    nets.initialize(net, cfg.model, seed=0, ctx=[mx.cpu()], input_shape=shape)
    return role_counts(param_roles(net.collect_params(), cfg.optim.decay_bn_bias))


def _load(args: argparse.Namespace):
    from mxlarge.config import load_config
    return load_config(args.config, args.overrides)


def _train(args: argparse.Namespace) -> int:
    from mxlarge.run import train

    cfg = _load(args)
    result = train(cfg, args.config, resume=args.resume)
    if result.rank == 0:
        final = result.final
        acc = final.get("val_accuracy")
        layout = f"{result.num_workers} worker(s)"
        if cfg.dist.devices > 1:
            layout += f" x {cfg.dist.devices} devices"
        if cfg.dist.simulate_workers > 1:
            layout += f" simulating {cfg.dist.simulate_workers} workers"
        print(f"done: {result.steps} steps on {layout} in "
              f"{result.seconds:.1f} s" + (f", final validation accuracy {acc:.4f}"
                                           if acc is not None else ""))
        if result.run_id:
            from mxlarge.tracking import tracking_uri
            print(f"MLflow run {result.run_id} in {tracking_uri(cfg)} "
                  f"(mlflow ui --backend-store-uri {tracking_uri(cfg)})")
    return 0


def _fail(message: str, code: int) -> int:
    print(f"mxlarge: error: {message}", file=sys.stderr)
    return code


def main(argv: Sequence[str] | None = None) -> int:
    _run_ps_role_if_any()
    if os.environ.get("DMLC_ROLE") != "worker":
        return _main(argv)
    # A dist worker that fails must leave at once: a normal interpreter exit waits in ps-lite's
    # exit barrier for workers that are themselves waiting for this one (a deadlock).
    from mxlarge.launcher.worker import exit_now, fail_fast
    with fail_fast():
        code = _main(argv)
    if code:
        exit_now(code)
    return code


def _main(argv: Sequence[str] | None) -> int:
    parser = _parser()
    # key=value overrides may come before or after options (argparse stops collecting
    # positionals at the first option)
    args, extra = parser.parse_known_args(argv)
    bad = [e for e in extra if e.startswith("-") or "=" not in e]
    if bad:
        parser.error(f"unrecognized arguments: {' '.join(bad)}")
    args.overrides = list(getattr(args, "overrides", [])) + extra
    from mxlarge.checkpoint import CheckpointError
    from mxlarge.config import ConfigError
    from mxlarge.errors import DivergenceError, ReplicaMismatch

    try:
        if args.verb == "show":
            return _show(args)
        if args.verb == "train":
            return _train(args)
        if args.verb == "launch":
            from mxlarge.launch_cli import launch
            return launch(args)
        if args.verb == "sweep":
            from mxlarge.sweep import sweep_command
            return sweep_command(args)
        if args.verb == "report":
            from mxlarge.report import report_command
            return report_command(args)
    except (ConfigError, CheckpointError) as exc:
        return _fail(str(exc), 2)
    except (DivergenceError, ReplicaMismatch) as exc:
        return _fail(str(exc), 1)
    except KeyboardInterrupt:
        return _fail("interrupted", 130)
    return 0


if __name__ == "__main__":
    sys.exit(main())
