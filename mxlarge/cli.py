"""The ``mxlarge`` command line: a few verbs, each a thin layer over the library (the verbs and
the exit statuses are :data:`USAGE`, which is also the top-level help)."""
from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from mxlarge.errors import DivergenceError, InputError, ReplicaMismatch, StopRequested

if TYPE_CHECKING:  # the CLI imports its commands' modules late, when they run
    from mxlarge.config import Config

USAGE = """\
verbs:
  mxlarge train  CONFIG [key=value ...]          train in this process (or as one launched rank)
  mxlarge show   CONFIG [key=value ...] [--json] [--lr-at 0,10,...]
  mxlarge show   --explain KEY                   what a config key means
  mxlarge launch CONFIG -n K [-s S] [--launcher local|ssh|mpi|slurm] [-H HOSTFILE]
  mxlarge sweep  SWEEP.yaml [key=value ...]      a grid of runs x seeds, one MLflow parent run
  mxlarge report NAME                            tables and plots of a sweep

exit status: 0 done, 1 training failed, 2 bad input (config, arguments, files)"""


def _run_ps_role_if_any() -> None:
    """A ps-lite scheduler or server runs its role inside ``import mxnet`` and exits there.

    This must happen before anything else is imported: MXNet is half-initialised in that role
    (``mxnet.gluon``, gluoncv and mlflow are not importable there).
    """
    if os.environ.get("DMLC_ROLE") in ("scheduler", "server"):
        import mxnet  # noqa: F401  (runs the role, then sys.exit())
        sys.exit(0)


def _parser() -> argparse.ArgumentParser:
    from mxlarge import __version__

    p = argparse.ArgumentParser(
        prog="mxlarge", formatter_class=argparse.RawDescriptionHelpFormatter, epilog=USAGE,
        description="Large-minibatch SGD (Goyal et al. 2017) for MXNet Gluon on dist_sync, "
                    "tracked in MLflow.")
    p.add_argument("--version", action="version", version=f"mxlarge {__version__}")
    sub = p.add_subparsers(dest="verb", required=True)

    t = sub.add_parser("train", help="train per an experiment YAML")
    t.add_argument("config")
    t.add_argument("overrides", nargs="*", metavar="key=value")
    t.add_argument("--resume", nargs="?", const="latest", default=None, metavar="latest|PATH",
                   help="continue from a checkpoint (default: the latest of train.checkpoint_dir)")
    t.add_argument("--run-id", default=None, metavar="ID",
                   help="log into this existing MLflow run, which the caller ends (mxlarge "
                        "launch passes its job's run to every worker this way)")
    t.add_argument("--world", default=None, metavar="PxDxSxN",
                   help="train in this world: worker processes x devices x simulated workers x "
                        "per-unit batch (e.g. 2x1x1x32), in place of the config's dist.workers "
                        "and dist.simulate_workers (refused if it contradicts data.batch_size, "
                        "dist.devices or a local store); mxlarge launch passes the world it "
                        "decided to every worker this way")

    s = sub.add_parser("show", help="print the resolved config and derived numbers")
    s.add_argument("config", nargs="?", default=None)
    s.add_argument("--explain", default=None, metavar="KEY",
                   help="print what config key KEY (e.g. optim.base_lr) means, and its default")
    s.add_argument("overrides", nargs="*", metavar="key=value")
    s.add_argument("--json", action="store_true", help="machine-readable output")
    s.add_argument("--lr-at", default="", help="comma-separated steps to print the LR at")

    la = sub.add_parser("launch", help="run CONFIG as a dist_sync job (scheduler, servers, "
                                       "workers)")
    la.add_argument("config")
    la.add_argument("overrides", nargs="*", metavar="key=value")
    la.add_argument("-n", "--workers", type=int, default=None,
                    help="worker processes, as the override dist.workers=N sets them "
                         "(default: the config's dist.workers); the workers get the job's "
                         "world as train --world")
    from mxlarge.launcher.flags import add_elastic_flags, add_job_flags
    add_job_flags(la, servers="server processes: the override dist.servers=S (default: the "
                              "config's dist.servers)",
                  restarts="after a failure (crash, kill, stall) relaunch the whole job from "
                           "its newest checkpoint, up to N times, in the same MLflow run (turns "
                           "on train.checkpoint_every=1 if checkpoints are off); see "
                           "mxlarge/launcher/restart.py")
    la.add_argument("--server-hosts", default=None, metavar="HOST[,HOST...]",
                    help="hosts that run servers only, as the override dist.server_hosts "
                         "sets them (ssh: addresses, mpi: names, slurm: nodes of the "
                         "allocation; default: the config's, else the hostfile's role=server "
                         "lines, else servers share the worker hosts)")
    la.add_argument("--resume", nargs="?", const="latest", default=None, metavar="latest|PATH",
                    help="continue from a checkpoint (default: the latest of "
                         "train.checkpoint_dir)")
    la.add_argument("--run-id", default=None, metavar="ID",
                    help="run the job in this existing MLflow run, which the caller ends "
                         "(mxlarge sweep does this); default: a new run that launch ends")
    add_elastic_flags(la)

    sw = sub.add_parser("sweep", help="run a sweep file's grid of labelled runs x seeds "
                                      "(resumable; see mxlarge/sweep.py)")
    sw.add_argument("sweep")
    sw.add_argument("overrides", nargs="*", metavar="key=value")
    sw.add_argument("--dry-run", action="store_true", help="list the cells and which are done")
    sw.add_argument("--part", default=None, metavar="I/N",
                    help="run only cells I, I+N, I+2N, ... (1-based): N processes with parts "
                         "1/N..N/N share a sweep without running a cell twice")
    sw.add_argument("--label", action="append", default=None, metavar="LABEL",
                    help="run only this label's cells (repeatable); the others stay to run")

    r = sub.add_parser("report", help="markdown table and plots of a sweep's runs, logged to its "
                                      "parent MLflow run")
    r.add_argument("name", help="the sweep name (tag sweep=NAME)")
    r.add_argument("--out", default=None, help="output directory (default: reports/NAME)")
    r.add_argument("--target-fraction", type=float, default=0.99,
                   help="target = this x the best validation accuracy in the sweep")
    r.add_argument("--experiment", default=None,
                   help="MLflow experiment (default: $MLFLOW_EXPERIMENT_NAME, else mxlarge)")
    return p


def _explain(key: str) -> int:
    """``show --explain KEY``: the field's ``_f`` doc string and default."""
    from mxlarge.config import Config, field_docs, flatten
    from mxlarge.errors import closest

    docs = field_docs()
    if key not in docs:
        near = closest(key, list(docs))
        raise InputError(f"--explain {key!r}: no such config key"
                         + (f" (did you mean {near[0]!r}?)" if near else ""))
    print(f"{key}: {docs[key]} (default: {flatten(Config())[key]!r})")
    return 0


def _show(args: argparse.Namespace) -> int:
    from mxlarge.config import dump_yaml, to_dict
    from mxlarge.plan import plan_for, precision, server_layout

    if args.explain is not None:
        return _explain(args.explain)
    if args.config is None:
        raise InputError("show: expected CONFIG (or --explain KEY)")
    cfg = _load(args)
    p = plan_for(cfg, args.config)
    try:
        steps = [int(x) for x in args.lr_at.split(",") if x.strip()]
    except ValueError:
        raise InputError(f"--lr-at {args.lr_at!r}: expected comma-separated integers") from None
    if any(s < 0 for s in steps):
        raise InputError(f"--lr-at {args.lr_at!r}: steps must be >= 0")
    roles, init = _built_net_facts(cfg)
    if init.warning():
        print(f"mxlarge: warning: {init.warning()}", file=sys.stderr, flush=True)
    out = {"config": to_dict(cfg),
           "plan": {**p.summary(), "lr_at": {str(s): p.schedule(s) for s in steps}},
           "param_roles": roles,
           "precision": precision(cfg),
           "layout": server_layout(cfg, roles["pushed_elements"]),
           "zero_gamma": {"blocks": len(init.zero_gamma),
                          "residual_blocks": init.residual_blocks,
                          "skipped": [f"{name} ({kind})" for name, kind in init.skipped]}}
    if args.json:
        print(json.dumps(out, indent=2))
        return 0
    print(dump_yaml(cfg).rstrip())
    print("---")
    print(f"job: {p.world.describe()}")
    if p.lr_note:
        print(f"note: {p.lr_note}")
    for k, v in out["plan"].items():
        if k == "lr_at":
            for s, lr in v.items():
                print(f"lr at step {s}: {lr:.6g}")
        else:
            print(f"{k}: {v}")
    for k, v in roles.items():
        print(f"params {k}: {v}")
    for k, v in out["precision"].items():
        print(f"precision {k}: {v}")
    lay = out["layout"]
    mb = lay["worker_host_bytes_each_way"] / 1e6
    if cfg.dist.server_hosts:
        print(f"layout: {lay['servers']} server(s) on their own host(s) "
              f"{', '.join(cfg.dist.server_hosts)}: each worker host sends and receives "
              f"|g| = {mb:.3g} MB per step (co-located: 2(n-1)/n·|g| = "
              f"{lay['colocated_bytes_each_way'] / 1e6:.3g} MB), each server host "
              f"{lay['server_host_bytes_each_way'] / 1e6:.3g} MB")
    else:
        print(f"layout: {lay['servers']} server(s) co-located with the workers: each worker "
              f"host sends and receives 2(n-1)/n·|g| = {mb:.3g} MB per step (with server "
              f"hosts, dist.server_hosts: |g| = "
              f"{lay['server_hosts_bytes_each_way'] / 1e6:.3g} MB)")
    print(f"zero_gamma: {len(init.zero_gamma)} of {init.residual_blocks} residual blocks"
          + (f" (skipped: {len(init.skipped)})" if init.skipped else ""))
    return 0


def _built_net_facts(cfg: Config) -> tuple[dict[str, int], Any]:
    """Builds and initialises the net (no data needed): parameter role counts and the
    :class:`~mxlarge.nets.init.InitReport`."""
    import mxnet as mx

    from mxlarge import nets
    from mxlarge.kvstore.roles import param_roles, role_counts

    shape = {"digits": (1, 8, 8), "cifar10": (3, 32, 32), "mnist1d": (1, 1, 40)}.get(
        cfg.data.dataset, (3, cfg.data.image_size, cfg.data.image_size))
    net = nets.build_net(cfg.model, cfg.data.num_classes)
    report = nets.initialize(net, cfg.model, seed=0, ctx=[mx.cpu()], input_shape=shape)
    return role_counts(param_roles(net.collect_params(), cfg.optim.decay_bn_bias)), report


def _load(args: argparse.Namespace) -> Config:
    from mxlarge.config import load_config
    return load_config(args.config, args.overrides)


def _train(args: argparse.Namespace) -> int:
    from mxlarge.plan import World
    from mxlarge.protocol.heartbeat import launched_dir
    from mxlarge.protocol.reports import launched_reports
    from mxlarge.run import train

    cfg = _load(args)
    # this process's root: what the caller gave it (--run-id, --world, the launcher's heartbeat
    # and report directories) is read here and passed down
    world = World.parse(args.world) if args.world is not None else None
    result = train(cfg, args.config, resume=args.resume, run_id=args.run_id,
                   heartbeat_dir=launched_dir(), world=world, reports_dir=launched_reports())
    if result.rank == 0:
        acc = result.final.get("val/accuracy")
        print(f"done: {result.steps} steps on {result.plan.world.describe()} in "
              f"{result.seconds:.1f} s" + (f", final validation accuracy {acc:.4f}"
                                           if acc is not None else ""))
        if result.run_id:
            from mxlarge.tracking import tracking_uri, ui_hint
            print(f"MLflow run {result.run_id}: {ui_hint(tracking_uri(cfg), result.run_id)}")
    return 0


def _fail(message: str, code: int) -> int:
    """Prints ``mxlarge: error: MESSAGE`` (one line) and returns the exit status."""
    print(f"mxlarge: error: {message}", file=sys.stderr)
    return code


def main(argv: Sequence[str] | None = None) -> int:
    _run_ps_role_if_any()
    if os.environ.get("DMLC_ROLE") != "worker":
        return _main(argv)
    # A dist worker that fails must leave at once: a normal interpreter exit waits in ps-lite's
    # exit barrier for workers that are themselves waiting for this one (a deadlock).
    from mxlarge.protocol.failfast import exit_now, fail_fast
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
            from mxlarge.reporting.cli import report_command
            return report_command(args)
    except InputError as exc:
        return _fail(str(exc), 2)
    except (DivergenceError, ReplicaMismatch) as exc:
        return _fail(str(exc), 1)
    except StopRequested as exc:  # rank 0 at the launcher's word, after its hooks kept what it had
        print(f"mxlarge: stopped after {exc.step} steps (Ctrl-C at the launcher)", flush=True)
        return 130
    except KeyboardInterrupt:
        return _fail("interrupted", 130)
    return 0


def _exit_launcher(code: int) -> None:
    """End ``python -m mxlarge.cli launch`` without the interpreter's finalization: with MXNet
    and MLflow loaded it took 5.7 s on this 2-core box at a load of 7 (after the atexit
    handlers, which run here), and the job ends when its launcher exits. The job's processes
    (``train``) exit normally: their store's shutdown needs it."""
    import atexit
    import logging

    atexit._run_exitfuncs()
    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


if __name__ == "__main__":
    status = main()
    if sys.argv[1:2] == ["launch"]:
        _exit_launcher(status)
    sys.exit(status)
