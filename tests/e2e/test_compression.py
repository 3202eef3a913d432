"""2-bit gradient compression on a launched job: gradients are compressed, collectives are not.

MXNet compresses every push of a store once compression is set; before the exact gathers of
``kvstore/sync.py`` the replica check failed at step 0 and evaluation reported accuracy 1.0.
"""
import re

import mxnet as mx
import numpy as np
import pytest

from tests.helpers import BN_CONFIG, cli, load_params


def _offline_accuracy(cfg_path, params_path) -> float:
    """Top-1 accuracy of the saved parameters on the whole validation set, in this process."""
    from mxlarge import data as data_mod
    from mxlarge import nets
    from mxlarge.config import load_config

    cfg = load_config(str(cfg_path), [])
    data = data_mod.build_data(cfg.data, rank=0, num_workers=1, seed=cfg.train.seed)
    net = nets.build_net(cfg.model, data.num_classes)
    net.load_parameters(str(params_path), ctx=mx.cpu())
    hits = count = 0
    for x, y in data.val.batches(64):
        hits += int((net(x).argmax(axis=1) == y.astype("float32")).sum().asscalar())
        count += x.shape[0]
    return hits / count


@pytest.mark.timeout(400)
def test_2bit_job_passes_replica_checks_and_reports_exact_statistics(tmp_path):
    """Launched 2 workers + 1 server, BN net, ``dist.compression=2bit``, replica check every
    step, ``bn_stats=reduce``: the job finishes, the shared BN statistics are the mean of the
    two workers' own, and the printed validation accuracy is that of the saved parameters."""
    cfg = tmp_path / "bn.yaml"
    cfg.write_text(BN_CONFIG)
    r = cli(["launch", str(cfg), "-n", "2", "-s", "1", "dist.compression=2bit",
             "dist.bn_stats=reduce", f"train.save_params={tmp_path}/bn-{{rank}}.params"],
            tmp_path, timeout=380)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    shared = [load_params(tmp_path / f"bn-{i}.params") for i in range(2)]
    local = [load_params(tmp_path / f"bn-{i}.params.local") for i in range(2)]
    stats = [n for n in local[0] if "running_" in n]
    assert stats
    assert any(not np.array_equal(local[0][n], local[1][n]) for n in stats)
    for n in stats:
        np.testing.assert_allclose(shared[0][n], (local[0][n] + local[1][n]) / 2, rtol=1e-6,
                                   atol=1e-7)
        np.testing.assert_array_equal(shared[0][n], shared[1][n])
    m = re.search(r"final validation accuracy ([0-9.]+)", r.stdout)
    assert m, r.stdout[-3000:]
    printed = float(m.group(1))
    assert printed < 1.0
    assert printed == pytest.approx(_offline_accuracy(cfg, tmp_path / "bn-0.params"), abs=6e-5)
