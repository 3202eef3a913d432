"""System metrics (mxlarge/tracking/system.py): a run of 10 s or more has at least 3 samples,
and a run too short for the interval still has one (the sampler logs the interval in progress
when it is finished)."""
import os
import time

import pytest

from mxlarge import tracking


def _samples(uri, seconds):
    run = tracking.RunHandle.create_plain(uri, "mxlarge", {"mlflow.runName": "t"})
    sampler = tracking.system_metrics(run, os.getpid())
    time.sleep(seconds)
    sampler.finish()
    c = tracking.client(uri)
    return {k: c.get_metric_history(run.run_id, k)
            for k in ("system/cpu_utilization_percentage", "system/job_processes")}


@pytest.mark.timeout(120)
def test_a_run_of_10_s_has_at_least_3_samples(mlflow_uri, monkeypatch):
    monkeypatch.delenv("MLFLOW_SYSTEM_METRICS_SAMPLING_INTERVAL", raising=False)
    assert tracking.SAMPLE_EVERY[0] <= 10 / 3
    got = _samples(mlflow_uri, 10)
    cpu, job = got["system/cpu_utilization_percentage"], got["system/job_processes"]
    assert len(cpu) >= 3 and len(job) == len(cpu), (len(cpu), len(job))
    assert sorted(m.step for m in cpu) == list(range(len(cpu)))  # one point per sample


def test_a_short_run_has_one_sample(mlflow_uri, monkeypatch):
    monkeypatch.delenv("MLFLOW_SYSTEM_METRICS_SAMPLING_INTERVAL", raising=False)
    got = _samples(mlflow_uri, 0.2)
    assert len(got["system/cpu_utilization_percentage"]) >= 1
    assert len(got["system/job_processes"]) >= 1
