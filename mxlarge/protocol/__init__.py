"""The contract between the launcher and the processes it starts (the worker side of a
job).

Both sides import this package and nothing else of each other: the launcher
(:mod:`mxlarge.launcher`) sits on top of the training code, and the training code
(:mod:`mxlarge.trainer`, :mod:`mxlarge.run`) never imports the launcher.

* :mod:`mxlarge.protocol.heartbeat`: progress records, one small file per worker, that the
  launcher's stall watchdog and straggler rule read
  (:class:`~mxlarge.protocol.heartbeat.Record`), written by a
  :class:`~mxlarge.protocol.heartbeat.HeartbeatWriter`;
  :func:`~mxlarge.protocol.heartbeat.launched_dir` is the one reader of the directory the
  launcher hands a process in its environment.
* :mod:`mxlarge.protocol.reports`: the job's report directory, where workers leave what the
  launcher collects at the end (a timeline's files).
* :mod:`mxlarge.protocol.failfast`: a failing dist_sync worker leaves at once instead of
  deadlocking in ps-lite's exit barrier, so the launcher sees the failure.

Importing this package does not import MXNet.
"""
