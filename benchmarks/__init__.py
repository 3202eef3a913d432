"""Benchmarks of mxlarge whose every figure is a ratio of two things measured in the same run.

Run them all with ``make bench`` (``python -m benchmarks.run``); see ``benchmarks/README.md``.
Importing this package imports nothing heavy: worker scripts in it are also started as ps-lite
schedulers and servers, which must reach ``import mxnet`` first.
"""
