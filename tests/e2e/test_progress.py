"""Live progress where users look: a launched job's output (a pipe) gets a line every
``train.log_every`` steps, and no carriage-return frames."""
import re

import pytest

from tests.helpers import EQ_CONFIG, cli


@pytest.mark.timeout(300)
def test_launched_job_prints_a_progress_line_every_log_every_steps(tmp_path):
    cfg = tmp_path / "eq.yaml"
    cfg.write_text(EQ_CONFIG)
    r = cli(["launch", str(cfg), "-n", "2", "-s", "1", "train.max_steps=30",
             "train.log_every=10", "train.progress=true"], tmp_path)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    # every process exited by itself: no worker had to be ended after it finished (issue 42)
    assert "job finished: 2 worker(s), 1 server(s) and the scheduler exited 0" in r.stdout
    assert "[launcher] warning" not in r.stdout
    lines = re.findall(r"step (\d+)/(\d+) epoch 1/1 loss=(\S+) lr=(\S+) images/s=(\S+) "
                       r"eta=(\S+)", r.stdout)
    assert [int(s) for s, *_ in lines] == [10, 20, 30]
    assert {int(t) for _, t, *_ in lines} == {30}
    assert all(float(ips) > 0 and float(loss) > 0 for _, _, loss, _, ips, _ in lines)
    assert "\r" not in r.stdout + r.stderr
