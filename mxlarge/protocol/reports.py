"""The job's report directory: where workers leave what the launcher collects when the
job ends.

The launcher makes one per job, apart from the heartbeats
(:mod:`mxlarge.protocol.heartbeat`), and gives every process its path in :data:`ENV`. A
worker writes files there (a timeline's ``timeline-worker-<rank>.json``,
:mod:`mxlarge.timeline`); the launcher reads them once the job is over
(:mod:`mxlarge.launcher.reports`). Importing this module does not import MXNet.
"""
from __future__ import annotations

import os
from pathlib import Path

ENV = "MXLARGE_REPORT_DIR"


def launched_reports() -> Path | None:
    """The report directory the launcher gave this process (:data:`ENV`), or None
    outside a launched job. The one reader of :data:`ENV`; call it at a process's root
    and pass the result down."""
    directory = os.environ.get(ENV)
    return Path(directory) if directory else None
