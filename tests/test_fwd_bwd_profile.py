"""A finding pinned: the same graph's forward+backward runs the same engine operators
under mxlarge.Trainer (gradients as views of its fusion buckets) as under gluon.Trainer, and
mxlarge's step issues fewer update kernels (benchmarks/README.md, section 14)."""
from __future__ import annotations

import os
import stat

from benchmarks.fwd_bwd_profile import profile_net


def test_forward_backward_runs_the_same_operators_under_both_trainers() -> None:
    out = profile_net("demo", steps=1, profiled=2)
    gluon, ours = (out[w]["operators_fwd_bwd"] for w in ("gluon", "mxlarge"))
    # variable deletions follow Python's frees, not the graph
    gluon.pop("DeleteVariable", None)
    ours.pop("DeleteVariable", None)
    assert ours == gluon
    assert sum(gluon.values()) >= 10  # the graph's segments and ops were seen at all
    assert not any("KVStore" in name for name in ours)  # no exchange inside backward
    kernels = {w: sum(n for name, n in out[w]["operators_step"].items() if "sgd" in name)
               for w in ("gluon", "mxlarge")}
    assert 0 < kernels["mxlarge"] < kernels["gluon"]
    # MXNet's profiler replaces a device it is given as its file: the profile keeps its own
    assert stat.S_ISCHR(os.stat("/dev/null").st_mode)
