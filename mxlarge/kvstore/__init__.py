"""Push/pull, the updater and parameter roles. Constants here are shared with the config (which
must not import MXNet)."""

#: Default bucket size of gradient fusion, in bytes (0 turns fusion off), chosen by measurement
#: (``bandwidth_1w1s*`` rows of benchmarks/results/latest.md: buckets of 256 KiB move
#: ResNet-50's gradients as fast as one key per tensor, 4 MiB ones at ~0.8x: on loopback the
#: copies into and out of a bucket cost as much as the transfer).
FUSION_BYTES = 256 << 10
