"""Process settings the launcher adds to each role's environment, and why (measured in
``benchmarks/``: rows ``bandwidth_1w1s`` vs ``bandwidth_1w1s_untuned``, and ``link_*`` of
``make bench-cluster``).

A setting is added only when its variable is not set already (in the launcher's own
environment or its ``env`` argument): the user's value always wins, and ``tuning=False``
(``--no-tuning``) adds none.

* **glibc malloc keeps freed memory** (:data:`MALLOC`, every role). ps-lite and MXNet's server
  allocate fresh buffers for every request; glibc serves large ones with ``mmap`` and unmaps
  them on ``free``, so every push and pull pays page faults and kernel zeroing of its buffers
  (~9 % of a server's and ~5 % of a worker's CPU time in the perf profile of
  benchmarks/README.md). With these thresholds freed memory stays in the heap and is reused.
  The price: a process's resident memory does not shrink back after its peak.
* **Every tensor that travels alone split over every server** (``MXNET_KVSTORE_BIGARRAY_BOUND``
  = the gradient bucket's size in floats, 65,536, every role; MXNet's default is 1,000,000).
  A key below the bound goes whole to server ``(key · 9973) mod S``, so the many mid-sized
  tensors of a real net (ResNet-50's 1×1 and 3×3 convolutions are 65 k – 2.4 M floats, most of
  its bytes) land unevenly and the busiest server's link sets the pace; from the bound on a
  key is sliced evenly over all servers. A tensor travels alone when it fills a bucket (as
  pieces of S buckets with S ≥ 2 servers: :func:`mxlarge.kvstore.fusion.fuse`), so with
  the bound at the bucket size only buckets go whole, and
  :func:`mxlarge.kvstore.fusion.spread` gives every server the same share of them. ResNet-50's
  gradients over 3 servers (an even third: 8.519 M floats): the busiest one sums 8.83 M with
  the former bound 100,000 and MXNet's own bucket placement, 8.72 M with ``spread``, 8.52 M
  with this bound (``tests/test_fusion.py``). Measured on the
  testbed (``make bench-cluster``): 3 workers + 3 servers at 1 Gbit/s 1.94× the bound |g|/B
  with MXNet's default, 1.26× with 100,000; co-located at 200 Mbit/s mxlarge's exchange
  1.053× the bare even layout's with 100,000, 1.027× with 65,536 (rows ``floor_*``).
* **OMP_NUM_THREADS** (local jobs only): 1 for the scheduler and servers (they receive, copy
  and sum; no operator needs a thread team) and ``cores // workers`` (at least 1) for each
  worker, which share this machine's cores: more OpenMP threads than cores make every
  operator's team wait on preempted members. A cluster launcher cannot know each host's
  cores or how many processes it places there, so for cluster jobs set it yourself; it is
  forwarded to every process.
"""
from __future__ import annotations

import os
from collections.abc import Mapping

from mxlarge.kvstore import FUSION_BYTES

#: glibc tunables: no ``mmap`` below 2 GB, never trim the heap below 4 GB free, grow it by
#: 512 MB at a time (address space only: pages are touched when used).
MALLOC = {"MALLOC_MMAP_THRESHOLD_": "2000000000", "MALLOC_TRIM_THRESHOLD_": "4000000000",
          "MALLOC_TOP_PAD_": "536870912"}
#: Every role of every job: malloc, and every key of a bucket's size or more (every tensor
#: that travels alone) sliced over all servers.
COMMON = {**MALLOC, "MXNET_KVSTORE_BIGARRAY_BOUND": str(FUSION_BYTES // 4)}


def local_role_env(role: str, workers: int, given: Mapping[str, str],
                   cores: int | None = None) -> dict[str, str]:
    """The variables a local job's ``role`` process gets on top of ``given`` (its environment
    so far); none that ``given`` already sets."""
    cores = (os.cpu_count() or 1) if cores is None else cores
    threads = max(1, cores // workers) if role == "worker" else 1
    wanted = {**COMMON, "OMP_NUM_THREADS": str(threads)}
    return {k: v for k, v in wanted.items() if k not in given}


def cluster_env(given: Mapping[str, str]) -> dict[str, str]:
    """The variables every process of a cluster job gets on top of ``given``."""
    return {k: v for k, v in COMMON.items() if k not in given}
