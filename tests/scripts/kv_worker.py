"""A tiny but real dist_sync program for the launcher tests.

Every role runs this same file, as with MXNet's own launch.py: a scheduler or server never gets
past ``import mxnet`` (it serves its role inside the import and exits there), a worker creates a
``dist_sync`` kvstore, pushes rank-dependent arrays and checks that the pulled value equals the
closed-form sum over all ranks.

Options (argv) let a test provoke failures:

``--sleep S``
    after the check, print ``ready`` and sleep ``S`` seconds (a window for kill tests).
``--exit-code C --exit-rank R``
    the worker whose kvstore rank is ``R`` exits with ``C`` right after the check, the way a
    failing worker must (``exit_now``: without ps-lite's exit barrier).
``--raise-rank R``
    the worker of rank ``R`` raises before its push; under ``fail_fast`` it exits with 1.
``--no-fail-fast``
    run without ``mxlarge.protocol.failfast.fail_fast`` (to pin that such a worker hangs).
``--report-env K1,K2``
    print the values of these environment variables (to see what reached a remote worker).
"""
from __future__ import annotations

import argparse
import os
import sys
import time
from typing import Any


def _parse(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--sleep", type=float, default=0.0)
    p.add_argument("--exit-code", type=int, default=0)
    p.add_argument("--exit-rank", type=int, default=-1)
    p.add_argument("--raise-rank", type=int, default=-1)
    p.add_argument("--no-fail-fast", action="store_true")
    p.add_argument("--report-env", default="")
    p.add_argument("--keys", type=int, default=4)
    p.add_argument("--size", type=int, default=8)
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    """Run one role of the test job; see the module docstring."""
    # Parse before importing mxnet so that a typo fails in every role, not only in workers.
    opts = _parse(sys.argv[1:] if argv is None else argv)
    role = os.environ.get("DMLC_ROLE", "?")
    print(f"kv_worker start role={role} local_rank={os.environ.get('MXLARGE_LOCAL_RANK', '?')}",
          flush=True)

    import mxnet as mx  # a scheduler/server serves its role inside this import, then exits

    from mxlarge.protocol.failfast import fail_fast

    if opts.no_fail_fast:
        return _work(mx, opts)
    with fail_fast():
        return _work(mx, opts)


def _work(mx: Any, opts: argparse.Namespace) -> int:
    from mxlarge.protocol.failfast import exit_now

    kv = mx.kv.create("dist_sync")
    rank, n = kv.rank, kv.num_workers
    print(f"kv_worker rank={rank} num_workers={n}", flush=True)
    for name in filter(None, opts.report_env.split(",")):
        print(f"kv_worker env {name}={os.environ.get(name, '<unset>')}", flush=True)

    keys = list(range(opts.keys))
    kv.init(keys, [mx.nd.zeros((opts.size,)) for _ in keys])
    if rank == opts.raise_rank:
        raise RuntimeError(f"kv_worker raising on purpose at rank {rank}")
    # Key k of worker r pushes (r + 1) * (k + 1); servers without an updater store the sum.
    kv.push(keys, [mx.nd.ones((opts.size,)) * (rank + 1) * (k + 1) for k in keys])
    outs = [mx.nd.zeros((opts.size,)) for _ in keys]
    kv.pull(keys, out=outs)
    for k, out in zip(keys, outs, strict=True):
        expected = (k + 1) * n * (n + 1) / 2
        got = out.asnumpy()
        if not (got == expected).all():
            print(f"kv_worker MISMATCH rank={rank} key={k} got={got} expected={expected}",
                  flush=True)
            exit_now(2)
    print(f"kv_worker sum OK rank={rank}", flush=True)

    if opts.exit_code and rank == opts.exit_rank:
        print(f"kv_worker exiting with {opts.exit_code} rank={rank}", flush=True)
        exit_now(opts.exit_code)
    if opts.sleep > 0:
        print(f"kv_worker ready rank={rank}", flush=True)
        deadline = time.monotonic() + opts.sleep
        while time.monotonic() < deadline:
            time.sleep(0.2)
    print(f"kv_worker done rank={rank}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
