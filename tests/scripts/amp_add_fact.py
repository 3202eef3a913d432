"""MXNet 1.9.1 fact (run in a process of its own: AMP patches MXNet for the whole process):
under bfloat16 AMP, a hybridized conv net's backward with ``grad_req='add'`` leaves the
convolution's and the dense layer's gradients at zero (only BatchNorm's, which runs in float32,
accumulate); with ``grad_req='write'`` they are there. Prints one line per mode:
``<mode> <max |grad| per trainable parameter, comma-separated>``."""
import mxnet as mx
from mxnet import autograd, gluon
from mxnet.contrib import amp

amp.init(target_dtype="bfloat16")
for mode in ("write", "add"):
    mx.random.seed(0)
    net = gluon.nn.HybridSequential()
    net.add(gluon.nn.Conv2D(8, 3, padding=1), gluon.nn.BatchNorm(), gluon.nn.Activation("relu"),
            gluon.nn.GlobalAvgPool2D(), gluon.nn.Dense(4))
    net.initialize(mx.init.Xavier())
    net.hybridize()
    params = [p for p in net.collect_params().values() if p.grad_req != "null"]
    net(mx.nd.zeros((4, 3, 8, 8)))
    for p in params:
        p.grad_req = mode
        p.zero_grad()
    x = mx.nd.random.normal(shape=(4, 3, 8, 8))
    with autograd.record():
        loss = gluon.loss.SoftmaxCrossEntropyLoss()(net(x), mx.nd.array([0, 1, 2, 3]))
    loss.backward()
    print(mode, ",".join(f"{float(p.grad().abs().max().asscalar()):.6g}" for p in params),
          flush=True)
