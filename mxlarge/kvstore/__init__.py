"""Push/pull, the updater and parameter roles. Constants here are shared with the config
(which must not import MXNet)."""
import os

#: Default bucket size of gradient fusion, in bytes (0 turns fusion off), chosen by
#: measurement (``bandwidth_1w1s*`` rows of benchmarks/results/latest.md: buckets of 256
#: KiB move ResNet-50's gradients as fast as one key per tensor, 4 MiB ones at ~0.8x: on
#: loopback the copies into and out of a bucket cost as much as the transfer).
FUSION_BYTES = 256 << 10


def spans_hosts() -> bool:
    """Whether this launched job's processes may be on several hosts (its scheduler is
    not on loopback), so gradient pieces pipeline a link
    (:func:`mxlarge.kvstore.fusion.piece_floats`); ``MXLARGE_PIECES=1`` or ``0`` says so
    instead."""
    uri = os.environ.get("DMLC_PS_ROOT_URI", "127.0.0.1")
    return os.environ.get("MXLARGE_PIECES", "0" if uri.startswith("127.") else "1") == "1"
