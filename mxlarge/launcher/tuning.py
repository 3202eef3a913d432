"""Process settings the launcher adds to each role's environment: glibc malloc keeps freed
memory (:data:`MALLOC`, every role), ``MXNET_KVSTORE_BIGARRAY_BOUND`` = the gradient bucket's
size in floats (every role), and for local jobs ``OMP_NUM_THREADS`` = 1 for the scheduler and
servers, max(1, cores // workers) for each worker. A setting is added only where its variable
is unset (the user's value wins); ``tuning=False`` (``--no-tuning``) adds none. Why, with the
measurements: "Process settings" in docs/design/launcher.md.
"""
from __future__ import annotations

import os
from collections.abc import Mapping

from mxlarge.kvstore import FUSION_BYTES

#: glibc tunables: no ``mmap`` below 2 GB, never trim the heap below 4 GB free, grow it
#: by 512 MB at a time (address space only: pages are touched when used).
MALLOC = {"MALLOC_MMAP_THRESHOLD_": "2000000000", "MALLOC_TRIM_THRESHOLD_": "4000000000",
          "MALLOC_TOP_PAD_": "536870912"}
#: Every role of every job: malloc, and every key of a bucket's size or more (every
#: tensor that travels alone) sliced over all servers.
COMMON = {**MALLOC, "MXNET_KVSTORE_BIGARRAY_BOUND": str(FUSION_BYTES // 4)}


def local_role_env(role: str, workers: int, given: Mapping[str, str],
                   cores: int | None = None) -> dict[str, str]:
    """The variables a local job's ``role`` process gets on top of ``given`` (its
    environment so far); none that ``given`` already sets."""
    cores = (os.cpu_count() or 1) if cores is None else cores
    threads = max(1, cores // workers) if role == "worker" else 1
    wanted = {**COMMON, "OMP_NUM_THREADS": str(threads)}
    return {k: v for k, v in wanted.items() if k not in given}


def cluster_env(given: Mapping[str, str]) -> dict[str, str]:
    """The variables every process of a cluster job gets on top of ``given``."""
    return {k: v for k, v in COMMON.items() if k not in given}
