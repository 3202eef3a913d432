"""The ``system/`` metrics of a run: MLflow's machine-wide sampler plus the job's own processes.

MLflow's sampler every ``SAMPLE_EVERY[0]`` s, every ``SAMPLE_EVERY[1]`` s after
``SAMPLE_EVERY[2]`` s, with :class:`JobMonitor` (Σ over the process tree under a root) beside it;
who samples a job: 'System metrics' in docs/design/tracking.md.
"""
from __future__ import annotations

import logging
import time
from typing import TYPE_CHECKING, Any

from mlflow.system_metrics.metrics.base_metrics_monitor import BaseMetricsMonitor
from mlflow.system_metrics.system_metrics_monitor import SystemMetricsMonitor

if TYPE_CHECKING:
    from mxlarge.tracking.run import RunHandle


# System metrics every 2 s (a 40-s run draws a curve), every 10 s (MLflow's default) once the
# sampler has run 5 minutes; $MLFLOW_SYSTEM_METRICS_SAMPLING_INTERVAL (MLflow's) wins.
SAMPLE_EVERY = (2.0, 10.0, 300.0)
# The run tag saying who samples the system metrics ("launcher": a local launcher, for the whole
# job, from before its processes start; else rank 0's MLflowHook, for its training).
SAMPLED_BY = "system_metrics_by"


class _Sampler(SystemMetricsMonitor):
    """MLflow's sampler (CPU, memory, disk, network, GPUs of this machine), switching from
    every ``SAMPLE_EVERY[0]`` to every ``SAMPLE_EVERY[1]`` seconds after ``SAMPLE_EVERY[2]``;
    its first CPU sample measures from its start (psutil's first reading is a meaningless 0.0)
    and :meth:`finish` logs a last sample (MLflow's drops the interval in progress), so a run
    of t seconds has about t / ``SAMPLE_EVERY[0]`` + 1 samples, and even a short one has one."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        import psutil

        super().__init__(*args, **kwargs)
        self.started = time.monotonic()
        psutil.cpu_percent(None)  # the reference point of the first sample's CPU reading

    def finish(self) -> None:
        running = self._process is not None
        super().finish()  # stops the thread and flushes what it published
        if not running:
            return
        try:
            self.collect_metrics()
            self.publish_metrics(self.aggregate_metrics())
            self.mlflow_logger.flush()
        except Exception as exc:  # noqa: BLE001 - a lost last sample must not fail the run
            logging.getLogger(__name__).warning("mxlarge: the last system metrics sample was "
                                                "not logged: %s", exc)

    def collect_metrics(self) -> dict[str, Any]:
        if (self.sampling_interval == SAMPLE_EVERY[0]
                and time.monotonic() - self.started > SAMPLE_EVERY[2]):
            self.sampling_interval = SAMPLE_EVERY[1]  # a long run: fewer points
        return super().collect_metrics()


def system_metrics(run: RunHandle, root: int) -> SystemMetricsMonitor:
    """A started sampler of the run's ``system/`` metrics: MLflow's (resuming a resumed run's
    steps) and the job's processes, those of the process tree under ``root``
    (:class:`JobMonitor`); ``.finish()`` stops it."""
    logging.getLogger("mlflow.system_metrics").setLevel(logging.WARNING)  # its INFO chatter
    sampler = _Sampler(run.run_id, tracking_uri=run.uri, resume_logging=True,
                       sampling_interval=SAMPLE_EVERY[0])
    sampler.monitors.append(JobMonitor(root))
    sampler.start()
    return sampler


class JobMonitor(BaseMetricsMonitor):
    """The job's own processes on this machine, beside MLflow's machine-wide numbers:
    ``system/job_cpu_utilization_percentage`` (Σ over the processes of their CPU time per
    wall second × 100, so 200 = two cores busy), ``system/job_memory_usage_megabytes`` (Σ
    resident set sizes) and ``system/job_processes``: process ``root`` and every process under
    it (a local launcher: itself, the scheduler, servers and workers; a cluster job's worker:
    the process on its host that started it; ``mxlarge train``: itself)."""

    def __init__(self, root: int) -> None:
        import psutil

        super().__init__()
        self._psutil = psutil
        self.root = psutil.Process(root)
        self._seen: dict[int, Any] = {}  # pid -> psutil.Process (cpu_percent needs the same one)
        self.root.cpu_percent(None)  # the root's first sample measures from here, not 0.0
        self._seen[root] = self.root

    def collect_metrics(self) -> None:
        psutil = self._psutil
        try:
            procs = [self.root, *self.root.children(recursive=True)]
        except psutil.Error:
            return  # the root is gone: the job is ending
        cpu = 0.0
        memory = 0.0
        alive = {}
        for proc in procs:
            mine = self._seen.get(proc.pid, proc)
            try:
                cpu += mine.cpu_percent(None)  # since its previous call; 0.0 at the first
                memory += mine.memory_info().rss / 1e6
            except psutil.Error:
                continue
            alive[proc.pid] = mine
        self._seen = alive
        self._metrics["job_cpu_utilization_percentage"].append(cpu)
        self._metrics["job_memory_usage_megabytes"].append(memory)
        self._metrics["job_processes"].append(float(len(alive)))

    def aggregate_metrics(self) -> dict[str, float]:
        return {k: round(sum(v) / len(v), 1) for k, v in self._metrics.items()}
