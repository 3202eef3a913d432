"""mxlarge.engine: when the engine reaches an array, with MXNet's real engine (one process)."""
from __future__ import annotations

import threading
import time

import mxnet as mx
import numpy as np
import pytest
from mxnet import gluon

from mxlarge import engine


def _conv_after_inference() -> gluon.nn.HybridSequential:
    """A hybridized conv net after an inference forward on CPU: its conv weight is in MKLDNN's
    layout (docs/mxnet-facts.md)."""
    net = gluon.nn.HybridSequential()
    net.add(gluon.nn.Conv2D(16, 3, in_channels=3), gluon.nn.Dense(10))
    net.initialize(mx.init.Xavier())
    net.hybridize(static_alloc=True, static_shape=True)
    net(mx.nd.random.uniform(shape=(8, 3, 16, 16))).wait_to_read()
    return net


def test_a_view_of_a_weight_in_mkldnn_layout_cannot_be_copied_but_a_probe_of_it_can():
    """The trap the probe avoids: a launched job's heartbeat, which copied a view of the first
    weight after every update, failed with it after an evaluation (a worker exited 1)."""
    weight = _conv_after_inference()[0].weight.data()
    with pytest.raises(mx.base.MXNetError, match="is_view"):
        weight.reshape((-1,))[0:1].copy().wait_to_read()
    first = engine.probe(weight)
    assert first.shape == (1, *weight.shape[1:])
    np.testing.assert_array_equal(first.asnumpy()[0], weight.asnumpy()[0])


def test_probe_all_reads_every_arrays_first_element_and_after_reads_changes_no_bit():
    a = mx.nd.array([[1.5, 2.0], [3.0, 4.0]])
    b = mx.nd.array([0.25, 9.0], dtype="float16")
    assert engine.probe_all([a, b]).asscalar() == 1.75
    assert engine.probe_all([a]).asscalar() == 1.5
    c = mx.nd.array([0.1, 0.2])
    before = c.asnumpy().tobytes()
    assert engine.probe_after_reads(c).asscalar() == np.float32(0.1)
    assert c.asnumpy().tobytes() == before


def test_a_probe_waits_for_the_writes_issued_before_it_and_a_mark_notes_when():
    """The probe is ready once the earlier write is done; a mark's thread notes the time
    after the write was issued and no later than the engine went idle."""
    x = mx.nd.random.uniform(shape=(600, 600))
    threads: list[threading.Thread] = []
    issued = time.time()
    y = mx.nd.dot(x, x)
    for _ in range(5):
        y = mx.nd.dot(y, x) / 600
    found = engine.mark(y, threads)
    mx.nd.waitall()
    idle = time.time()
    for t in threads:
        t.join(10)
    assert found.t is not None and issued <= found.t <= idle + 0.05
    early = engine.Mark(t=5.0)
    early.note(7.0)
    early.note(3.0)
    assert early.t == 3.0  # the earliest sighting stands
