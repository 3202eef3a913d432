"""mxlarge.Trainer in a user's own Gluon loop, launched as 2 workers + 1 server.

Gluon's usual pattern (``net.initialize()``, one inference forward pass, then the trainer) left
conv weights in MKLDNN's layout on CPU; the store's init then aborted the worker
(``!IsMKLDNNData()``) and the server (``init 0 first``).
"""
import sys
from pathlib import Path

import numpy as np
import pytest

from tests.helpers import load_params

SCRIPTS = Path(__file__).resolve().parents[1] / "scripts"


@pytest.mark.timeout(300)
@pytest.mark.parametrize("hybridize", ["0", "1"])
def test_init_then_inference_forward_then_trainer_trains(tmp_path, hybridize):
    """Conv+BN net, 4 steps with a replica check after each: the job exits 0 and both ranks
    hold identical trained parameters (the BN running statistics are each worker's own)."""
    from mxlarge.launcher import run_local

    with open(tmp_path / "log.txt", "w") as log:
        outcome = run_local([sys.executable, str(SCRIPTS / "gluon_loop_worker.py"), str(tmp_path),
                             hybridize], workers=2, servers=1, output=log)
    text = (tmp_path / "log.txt").read_text()
    assert outcome.exit_code == 0, text[-3000:]
    ranks = [load_params(tmp_path / f"rank-{r}.params") for r in range(2)]
    weights = [n for n in ranks[0] if n.endswith("weight")]
    assert len(weights) >= 3  # two convolutions and the dense layer
    trained = [n for n in ranks[0] if "running_" not in n]
    for n in trained:
        np.testing.assert_array_equal(ranks[0][n], ranks[1][n])
    # trained: the BN shift (initialised to 0) moved
    assert any(np.abs(ranks[0][n]).max() > 0 for n in ranks[0] if n.endswith("beta"))
