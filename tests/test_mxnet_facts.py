"""MXNet 1.9.1 facts mxlarge is built around, pinned against MXNet itself (in one process).

Each test states one fact of docs/mxnet-facts.md and fails if a future MXNet (or
another build, e.g. a GPU one) behaves differently; mxlarge's design would then need a second
look. The facts that need real dist_sync processes are in
``tests/e2e/test_mxnet_facts_dist.py``.
"""
import pickle
import subprocess
import sys
import textwrap

import mxnet as mx
import numpy as np
import pytest
from mxnet import autograd, gluon

from mxlarge.data.tiny import make_recordio


def test_pickled_optimizer_drops_param_dict_and_with_it_wd_mult():
    """Why ``update_on_kvstore=True`` loses ``wd_mult``/``lr_mult``: the optimizer reaches the
    servers pickled, and ``Optimizer.__getstate__`` leaves ``param_dict`` out."""
    p = gluon.Parameter("p", shape=(2,), wd_mult=0.0, lr_mult=3.0)
    opt = mx.optimizer.SGD(learning_rate=0.1, wd=0.5, param_dict={0: p})
    assert opt._get_wds([0]) == [0.0] and opt._get_lrs([0]) == [pytest.approx(0.3)]
    on_server = pickle.loads(pickle.dumps(opt, 0))
    assert on_server.param_dict == {}
    assert on_server._get_wds([0]) == [0.5] and on_server._get_lrs([0]) == [pytest.approx(0.1)]


def _nag(inplace: bool):
    w0 = np.array([1.0, 2.0], np.float32)
    w, v, g = mx.nd.array(w0), mx.nd.array([0.3, 0.1]), mx.nd.array([0.5, -1.0])
    out = w if inplace else mx.nd.zeros(2)
    mx.nd.nag_mom_update(w, g, v, out=out, lr=0.1, momentum=0.9, wd=0.01)
    return w0, g.asnumpy(), out.asnumpy(), v.asnumpy()


def test_mxnets_exit_skips_queued_operations_and_an_atexit_after_import_runs_first():
    """Why a script ending right after ``trainer.step()`` hung (mxlarge/protocol/session.py):
    ``import mxnet`` registers an ``atexit`` handler (``MXNotifyShutdown``) after which every
    queued engine operation is skipped: of 50 increments queued behind a chain of products
    (seconds of work) hardly any run; a handler registered after ``import mxnet`` runs before
    it (``atexit`` is last in, first out), and a ``waitall`` there runs them all."""
    script = textwrap.dedent("""
        import atexit, sys
        import mxnet as mx
        from mxnet.base import _LIB, check_call
        big, acc = mx.nd.ones((600, 600)), mx.nd.zeros((1,))
        mx.nd.waitall()
        for _ in range(50):
            big = mx.nd.dot(big, big) / 600.0
            acc += big[0, 0:1] * 0 + 1  # after this product
        if sys.argv[1] == "shutdown":
            check_call(_LIB.MXNotifyShutdown())
            print("acc", acc.asnumpy()[0])
        else:
            atexit.register(lambda: print("acc", (mx.nd.waitall(), acc.asnumpy()[0])[1]))
    """)
    done = {}
    for how in ("shutdown", "atexit"):
        r = subprocess.run([sys.executable, "-c", script, how], capture_output=True, text=True,
                           timeout=100)
        assert r.returncode == 0 and r.stdout.startswith("acc "), (how, r.stderr[-2000:])
        done[how] = float(r.stdout.split()[1])
    assert done["shutdown"] < 25 and done["atexit"] == 50, done


def test_nag_mom_update_is_eq10_whatever_its_docstring_says():
    """v ← m·v − η(g + λw); w ← w + m·v − η(g + λw): the LR inside the velocity (Goyal eq. 10),
    not the docstring's v ← γv + η∇J(w − γv), w ← w − v."""
    w0, g, w1, v1 = _nag(inplace=False)
    step = 0.1 * (g + 0.01 * w0)
    v_eq10 = 0.9 * np.array([0.3, 0.1], np.float32) - step
    np.testing.assert_allclose(v1, v_eq10, rtol=1e-6)
    np.testing.assert_allclose(w1, w0 + 0.9 * v_eq10 - step, rtol=1e-6)


def test_nag_mom_update_in_place_decays_the_velocity_with_the_updated_weight():
    """Called with ``out=weight`` (as ``mx.optimizer.NAG`` does), the weight is written first
    and the velocity's decay term λw then reads the *new* weight: updater.py never relies on
    the velocity from an in-place call."""
    _, g, w_new, v_inplace = _nag(inplace=True)
    _, _, w_out, v_out = _nag(inplace=False)
    np.testing.assert_array_equal(w_new, w_out)  # the weight is the same ...
    assert not np.allclose(v_inplace, v_out, rtol=1e-6)  # ... the velocity is not
    np.testing.assert_allclose(v_inplace, 0.9 * np.array([0.3, 0.1]) - 0.1 * (g + 0.01 * w_new),
                               rtol=1e-6)


class _Step:
    """LR 0.1 for update 1, then 0.2 (MXNet asks for num_update = 1 first)."""

    base_lr = 0.1

    def __call__(self, num_update: int) -> float:
        return 0.1 if num_update <= 1 else 0.2


def test_mxnet_lars_momentum_correction_applies_to_the_first_group_of_a_step_only():
    """``mx.optimizer.LARS(momentum_correction=True)`` keeps the previous LR in the object
    (``last_lr``/``cur_lr``): the first update call of a step sees η_t/η_{t−1}, every later call
    in the same step sees η_t/η_t = 1. With two parameter groups and the LR doubling, group 0's
    velocity is scaled by 2·m and group 1's by m."""
    opt = mx.optimizer.LARS(learning_rate=0.1, momentum=0.9, momentum_correction=True,
                            lr_scheduler=_Step(), param_idx2name={0: "a_bias", 1: "b_bias"})
    weights = [mx.nd.zeros(2), mx.nd.zeros(2)]
    states = [opt.create_state(i, w) for i, w in enumerate(weights)]
    for s in states:
        s[:] = 1.0
    zero = mx.nd.zeros(2)  # zero gradient, no decay: v ← m_eff · v exactly
    for _ in range(2):  # two steps, each updating group 0 then group 1
        for i in (0, 1):
            opt.update_multi_precision([i], [weights[i]], [zero], [states[i]])
    v0, v1 = (s.asnumpy() for s in states)
    np.testing.assert_allclose(v0, [0.9 * 1.8] * 2, rtol=1e-6)  # corrected: m·0.2/0.1
    np.testing.assert_allclose(v1, [0.9 * 0.9] * 2, rtol=1e-6)  # reset: m·0.2/0.2


@pytest.mark.parametrize("hybridize", [False, True])
def test_batchnorm_writes_running_statistics_in_backward_not_forward(hybridize):
    """The write mxlarge waits for before swapping, reducing or saving statistics happens in
    backward: after a training-mode forward (waited for) the statistics are untouched."""
    net = gluon.nn.HybridSequential()
    net.add(gluon.nn.Conv2D(2, 1), gluon.nn.BatchNorm())
    net.initialize()
    if hybridize:
        net.hybridize(static_alloc=True, static_shape=True)
    x = mx.nd.array(np.random.RandomState(0).randn(4, 1, 3, 3) * 3 + 2)
    net(x)
    mean = net[1].running_mean
    before = mean.data().asnumpy().copy()
    with autograd.record():
        y = net(x)
    mx.nd.waitall()
    np.testing.assert_array_equal(mean.data().asnumpy(), before)
    y.backward()
    mx.nd.waitall()
    assert not np.array_equal(mean.data().asnumpy(), before)


@pytest.fixture(scope="module")
def ten_records(tmp_path_factory):
    """10 random 40×56 JPEGs labelled 0..9, as an indexed RecordIO pair."""
    rng = np.random.RandomState(0)
    images = [rng.randint(0, 255, (40, 56, 3)).astype(np.uint8) for _ in range(10)]
    return make_recordio(tmp_path_factory.mktemp("rec") / "ten.rec", images, list(range(10)))


def _records(rec, idx, **kw):
    args = dict(path_imgrec=str(rec), path_imgidx=str(idx), data_shape=(3, 16, 16),
                batch_size=4, preprocess_threads=1, shuffle=False, verbose=False)
    return list(mx.io.ImageRecordIter(**{**args, **kw}))


def test_image_record_iter_pad_is_zero_for_a_short_last_batch_without_round_batch(ten_records):
    """10 records in batches of 4: the last batch holds 2 records and 2 stale slots, yet
    ``pad`` is 0 (so mxlarge reads with ``round_batch=True`` and counts records itself)."""
    batches = _records(*ten_records, round_batch=False)
    assert len(batches) == 3
    assert [b.label[0][:2].asnumpy().tolist() for b in batches][-1] == [8.0, 9.0]
    assert [b.pad for b in batches] == [0, 0, 0]
    assert [b.pad for b in _records(*ten_records, round_batch=True)] == [0, 0, 2]


def test_image_record_iter_seed_does_not_change_crop_and_flip_draws(ten_records):
    """``seed`` only seeds the shuffle: two iterators with different seeds give the same random
    crops and flips (which do happen: they differ from the unaugmented images)."""
    aug = dict(random_resized_crop=True, rand_mirror=True, min_random_area=0.3)
    a = [b.data[0].asnumpy() for b in _records(*ten_records, seed=1, **aug)]
    b = [b.data[0].asnumpy() for b in _records(*ten_records, seed=2, **aug)]
    plain = [b.data[0].asnumpy() for b in _records(*ten_records, seed=1)]
    assert all(np.array_equal(x, y) for x, y in zip(a, b))
    assert any(not np.array_equal(x, y) for x, y in zip(a, plain))


@pytest.mark.timeout(120)
def test_image_record_iter_aborts_the_process_on_a_truncated_rec(ten_records, tmp_path):
    """A truncated .rec is a C++ CHECK failure thrown on a decoding thread: ``SIGABRT``, no
    Python exception to catch (so mxlarge checks the .rec/.idx pair before reading)."""
    rec, idx = ten_records
    cut = tmp_path / "cut.rec"
    cut.write_bytes(rec.read_bytes()[:-100])
    script = textwrap.dedent(f"""
        import mxnet as mx
        it = mx.io.ImageRecordIter(path_imgrec={str(cut)!r}, path_imgidx={str(idx)!r},
                                   data_shape=(3, 16, 16), batch_size=4, preprocess_threads=1)
        try:
            for _ in it:
                pass
        except BaseException as exc:
            print("caught", type(exc).__name__)
        print("survived")
    """)
    r = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                       timeout=100)
    assert r.returncode == -6, (r.returncode, r.stdout, r.stderr[-2000:])
    assert "Invalid RecordIO Format" in r.stderr and "survived" not in r.stdout


def test_a_dist_store_outside_a_launched_job_is_mxnets_dmlc_num_worker_check():
    """A script's own ``mx.kv.create('dist_sync')`` with no launcher (no DMLC_* variables):
    MXNetError naming ``DMLC_NUM_WORKER``, the line docs/troubleshooting.md quotes."""
    from pathlib import Path

    line = 'MXNetError: Check  notnull: Environment::Get()->find("DMLC_NUM_WORKER")'
    env = {k: v for k, v in __import__("os").environ.items() if not k.startswith("DMLC_")}
    r = subprocess.run([sys.executable, "-c", "import mxnet as mx; mx.kv.create('dist_sync')"],
                       capture_output=True, text=True, timeout=100, env=env)
    assert r.returncode == 1 and line in r.stderr, r.stderr[-2000:]
    doc = (Path(__file__).resolve().parents[1] / "docs" / "troubleshooting.md").read_text()
    assert f"`{line}`" in doc


def test_bfloat16_amp_writes_no_accumulated_gradient_of_its_bfloat16_layers():
    """Why ``train.amp=bfloat16`` refuses ``dist.simulate_workers > 1`` (which accumulates with
    ``grad_req='add'``): under bfloat16 AMP the convolution's and dense layer's gradients stay
    zero with 'add' (BatchNorm's, in float32, accumulate). AMP patches MXNet for the whole
    process, so the script runs in its own (tests/scripts/amp_add_fact.py)."""
    from pathlib import Path

    script = Path(__file__).resolve().parent / "scripts" / "amp_add_fact.py"
    out = subprocess.run([sys.executable, str(script)], capture_output=True, text=True,
                         timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    rows = dict(line.split(" ", 1) for line in out.stdout.splitlines())
    write = [float(v) for v in rows["write"].split(",")]
    add = [float(v) for v in rows["add"].split(",")]
    # conv weight, conv bias, BN gamma, BN beta, dense weight, dense bias
    assert all(v > 0 for v in write)
    assert add[0] == add[1] == add[4] == add[5] == 0.0
    assert add[2:4] == write[2:4]
