"""Push/pull, the updater and parameter roles. Constants here are shared with the config (which
must not import MXNet)."""

#: Default bucket size of gradient fusion, in bytes (0 turns fusion off), chosen by measurement
#: (benchmarks/README.md, ``fusion_*`` rows).
FUSION_BYTES = 4 << 20
