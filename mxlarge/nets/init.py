r"""Goyal et al. (2017) initialisation, with generic zero-gamma for residual blocks.

The recipe (Goyal et al., "Accurate, Large Minibatch SGD", sec. 5.1 and appendix), each rule
switchable through :class:`~mxlarge.config.ModelConfig`:

* ``he_init``: every convolution weight :math:`W \in \mathbb{R}^{C_{out} \times C_{in}/g
  \times k_h \times k_w}` is drawn from :math:`\mathcal{N}(0, \sigma^2)` with

  .. math:: \sigma = \sqrt{2 / \mathrm{fan}_{out}}, \qquad
            \mathrm{fan}_{out} = C_{out} \, k_h \, k_w,

  Caffe2's ``MSRAFill`` used by the paper (``MSRAPrelu(factor_type='out', slope=0)`` in MXNet).
* ``fc_init_std``: the final Dense weight is drawn from :math:`\mathcal{N}(0, \mathrm{std}^2)`
  (0.01 in the paper); ``0`` leaves the builder's default.
* ``zero_gamma``: the last BatchNorm of the residual branch of every residual block gets
  :math:`\gamma = 0`, so that each block starts as its shortcut,
  :math:`y = \mathrm{relu}(\mathrm{shortcut}(x) + \mathrm{BN}_{\gamma=0}(\cdot)) =
  \mathrm{relu}(\mathrm{shortcut}(x))`, and the net starts shallow.
* always: biases 0; every other BatchNorm :math:`\gamma = 1, \beta = 0`; running mean 0 and
  running variance 1.

Any other parameter (a Dense that is not the last one, a convolution weight when ``he_init`` is
off, ...) gets its builder's default: ``Parameter.init`` when the layer set one, else
:data:`DEFAULT_INIT`, which is what ``net.initialize()`` would use.

Residual blocks are found generically: any Gluon block with a ``downsample`` attribute, whose
branch is traced to end in a BatchNorm that feeds the addition with the shortcut; others are
skipped and listed in :attr:`InitReport.skipped`. The rule and why pre-activation blocks are
skipped: docs/design/init.md.
"""
from __future__ import annotations

import json
import logging
from collections import Counter, defaultdict
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import mxnet as mx
import numpy as np
from mxnet.gluon import Block, HybridBlock, nn

from mxlarge.config import ModelConfig

__all__ = [
    "DEFAULT_INIT",
    "InitReport",
    "he_initializer",
    "initialize",
    "last_branch_batchnorm",
    "residual_blocks",
]

log = logging.getLogger(__name__)

#: The initializer for a parameter whose layer sets none: Gluon's own default
#: (``Block.initialize(init=Uniform())``), i.e. "the builder's default".
DEFAULT_INIT: mx.init.Initializer = mx.init.Uniform()

_CONVS = (nn.Conv1D, nn.Conv2D, nn.Conv3D)  # transposed convs have (C_in, C_out, ...) weights
_NORMS = (nn.BatchNorm, nn.BatchNormReLU)    # SyncBatchNorm is a BatchNorm subclass


@dataclass(frozen=True)
class InitReport:
    """What :func:`initialize` did.

    Attributes:
        he_convs: number of convolution weights drawn with He/MSRA (0 when ``he_init`` is off).
        final_dense: parameter name of the final Dense weight drawn from
            :math:`\\mathcal{N}(0, \\mathrm{fc\\_init\\_std}^2)`; ``None`` when the rule is off
            or the net has no Dense layer.
        zero_gamma: parameter names of the gammas set to 0, one per residual block whose branch
            ends in a BatchNorm (empty when ``zero_gamma`` is off).
        residual_blocks: number of residual blocks detected (whether or not zeroed).
        skipped: ``(block name, block type)`` of each residual block left as built although
            ``zero_gamma`` is on: no BatchNorm with a learnable gamma feeds its residual
            addition (pre-activation (v2), fused BN+ReLU or BN-free blocks).
    """

    he_convs: int
    final_dense: str | None
    zero_gamma: tuple[str, ...]
    residual_blocks: int
    skipped: tuple[tuple[str, str], ...] = ()

    def warning(self) -> str | None:
        """One line for the user when some residual blocks were skipped, else ``None``."""
        if not self.skipped:
            return None
        kinds = Counter(kind for _, kind in self.skipped)
        listed = ", ".join(f"{n} x {kind}" for kind, n in sorted(kinds.items()))
        return (f"zero-gamma applies to {len(self.zero_gamma)} of {self.residual_blocks} "
                f"residual blocks; skipped {listed}: no BatchNorm with a learnable gamma feeds "
                "their residual addition (pre-activation (v2), fused BN+ReLU or BN-free blocks "
                "keep gamma = 1)")


def he_initializer() -> mx.init.Initializer:
    """He/MSRA normal with :math:`\\sigma = \\sqrt{2/\\mathrm{fan}_{out}}` (Caffe2 ``MSRAFill``).

    ``MSRAPrelu`` is ``Xavier('gaussian', factor_type, magnitude=2/(1+slope^2))`` and MXNet's
    Xavier takes :math:`\\mathrm{fan}_{out} = C_{out} k_h k_w` from the weight shape, which is
    Caffe2's ``numel / shape[1]`` also for grouped convolutions.
    """
    return mx.init.MSRAPrelu(factor_type="out", slope=0.0)


def _walk(block: Block) -> Iterator[Block]:
    """``block`` and its descendants, depth first in registration order, each once."""
    seen: set[int] = set()
    stack = [block]
    while stack:
        b = stack.pop()
        if id(b) in seen:
            continue
        seen.add(id(b))
        yield b
        # _children is Gluon 1.x's registration-ordered child dict; reversed so pops keep order.
        stack.extend(reversed(list(b._children.values())))


def residual_blocks(net: Block) -> list[Block]:
    """All residual blocks of ``net`` (``net`` included), in registration order.

    A residual block is a block with a ``downsample`` attribute, the GluonCV convention
    (``BasicBlockV1/V2``, ``BottleneckV1/V2``, ``BasicBlockV1b``, ``BottleneckV1b``,
    ``CIFARBasicBlockV1/V2``, SE and ResNeXt blocks, ...) that
    :class:`mxlarge.nets.small.BasicBlock` follows too.
    """
    return [b for b in _walk(net) if hasattr(b, "downsample")]


def _trace(block: HybridBlock) -> tuple[list[dict], set[int]] | None:
    """The block's symbolic graph (nodes in topological order, head ids), ``None`` if untraceable.

    Works before initialisation: a symbolic call only needs the parameters' variables.
    """
    try:
        # A private NameManager keeps the global op-name counters untouched.
        with mx.name.NameManager():
            out = block(mx.sym.var("data"))
    # TypeError: a block that needs more inputs than one; AttributeError: NDArray-only code
    # (``x.shape``, ``.asnumpy()`` on a Symbol); ValueError/NotImplementedError/MXNetError:
    # ops or shapes that cannot be built symbolically. Anything else is a bug and propagates.
    except (TypeError, AttributeError, ValueError, NotImplementedError,
            mx.base.MXNetError) as exc:
        log.debug("cannot trace %s symbolically: %s", block.name, exc)
        return None
    if isinstance(out, (list, tuple)):
        out = mx.sym.Group(list(out))
    graph = json.loads(out.tojson())
    return graph["nodes"], {h[0] for h in graph["heads"]}


# Ops through which a zero BN output stays zero *and* gradients still flow to gamma: linear in
# the BN output (an SE gate multiplies it), unlike relu, whose derivative at 0 is 0 in MXNet.
_PASS_OPS = frozenset({"broadcast_mul", "elemwise_mul", "_mul", "_Mul", "_mul_scalar",
                       "_MulScalar", "Dropout", "Reshape", "reshape", "Flatten", "flatten",
                       "expand_dims", "identity", "_copy", "Cast", "amp_cast"})
_ADD_OPS = frozenset({"elemwise_add", "_plus", "_Plus", "_add", "broadcast_add",
                      "broadcast_plus", "add_n", "ElementWiseSum", "_grad_add"})


def _bn_ends_branch(block: Block, bn: nn.BatchNorm) -> bool:
    """Whether ``bn`` feeds the residual addition of ``block`` directly.

    In the traced graph, ``bn``'s output must reach an addition through :data:`_PASS_OPS` only,
    the addition's other operand must not depend on ``bn`` (it is the shortcut), and the sum
    must reach the block output. True for v1 blocks (``BN -> + shortcut -> relu``, also with an
    SE gate ``BN -> broadcast_mul -> +``); false for v2 blocks (``BN -> relu -> conv -> +``) and
    for blocks whose last BN goes through a relu without addition (e.g. GluonCV DLA's
    ``Tree``/``Root``, where a zero gamma would silence the block for good).

    Untraceable blocks fall back to registration order: no Conv or Dense registered after
    ``bn`` in the branch.
    """
    traced = _trace(block) if isinstance(block, HybridBlock) else None
    if traced is None:
        branch = _branch(block)
        after = branch[[id(b) for b in branch].index(id(bn)) + 1:]
        return not any(isinstance(b, (*_CONVS, nn.Dense)) for b in after)
    nodes, heads = traced

    def inputs(i: int) -> list[int]:
        return [inp[0] for inp in nodes[i]["inputs"]]

    consumers: dict[int, list[int]] = defaultdict(list)
    for i in range(len(nodes)):
        for j in inputs(i):
            consumers[j].append(i)

    def reach(starts: list[int], through: Callable[[int], bool] = lambda i: True) -> set[int]:
        seen = set(starts)
        stack = list(starts)
        while stack:
            for c in consumers[stack.pop()]:
                if c not in seen and through(c):
                    seen.add(c)
                    stack.append(c)
        return seen

    start = [i for i, n in enumerate(nodes)
             if n["op"] != "null" and any(nodes[j]["name"] == bn.gamma.name for j in inputs(i))]
    downstream = reach(start)
    # through pass-through ops, and through additions whose operands all come from bn
    linear = reach(start, lambda i: nodes[i]["op"] in _PASS_OPS or (
        nodes[i]["op"] in _ADD_OPS and all(j in downstream for j in inputs(i))))
    for i in linear:
        for c in consumers[i]:
            if (nodes[c]["op"] in _ADD_OPS and any(j not in downstream for j in inputs(c))
                    and reach([c]) & heads):
                return True
    return False  # also when bn is not used by the forward pass at all


def _branch(block: Block) -> list[Block]:
    """Descendants of a residual block (itself excluded) outside its ``downsample`` subtree."""
    down = getattr(block, "downsample", None)
    excluded = {id(b) for b in _walk(down)} if isinstance(down, Block) else set()
    return [b for b in _walk(block) if b is not block and id(b) not in excluded]


def last_branch_batchnorm(block: Block) -> nn.BatchNorm | None:
    """The BatchNorm just before the residual addition of ``block``, or ``None``.

    It is the last normalisation layer among ``block``'s descendants in registration order,
    ``downsample`` excluded, provided it is a plain ``BatchNorm`` (not a fused BN+relu) whose
    output is added to the shortcut directly (see :func:`_bn_ends_branch`). ``None`` for
    BN-free blocks and for pre-activation (v2) blocks, whose branch ends with a convolution.

    Checked against the GluonCV 0.10.5 sources: ``BasicBlockV1`` / ``CIFARBasicBlockV1`` give
    the second BN of ``body`` (``body -> + residual -> relu``), ``BottleneckV1`` the third,
    ``BasicBlockV1b`` ``bn2`` and ``BottleneckV1b`` ``bn3``; all are added to the shortcut
    directly. ``downsample`` is registered after them in v1b blocks and is excluded anyway.
    """
    norms = [b for b in _branch(block) if isinstance(b, _NORMS)]
    if not norms or not isinstance(norms[-1], nn.BatchNorm):
        return None
    bn = norms[-1]
    return bn if _bn_ends_branch(block, bn) else None


def _final_dense(net: Block) -> nn.Dense | None:
    """The classifier: the Dense whose op comes last in the traced graph (else last registered).

    Registration order alone could be fooled by a classifier registered before the features;
    the topological order of the graph cannot.
    """
    denses = [b for b in _walk(net) if isinstance(b, nn.Dense)]
    if len(denses) <= 1:
        return denses[0] if denses else None
    traced = _trace(net) if isinstance(net, HybridBlock) else None
    if traced is not None:
        nodes, _ = traced
        by_weight = {d.weight.name: d for d in denses}
        for node in reversed(nodes):
            if node["op"] == "FullyConnected":
                for inp in node["inputs"]:
                    hit = by_weight.get(nodes[inp[0]]["name"])
                    if hit is not None:
                        return hit
    return denses[-1]


def _fix_gamma(bn: nn.BatchNorm) -> bool:
    # scale=False makes the op ignore gamma (fix_gamma=True): zeroing it would do nothing.
    return bool(getattr(bn, "_kwargs", {}).get("fix_gamma", False))


def _shape_known(param: mx.gluon.Parameter) -> bool:
    return param.shape is not None and all(d > 0 for d in param.shape)


def initialize(net: Block, cfg: ModelConfig, *, seed: int, ctx: Any = None,
               input_shape: tuple[int, ...] | None = None) -> InitReport:
    """Initialises every parameter of ``net`` with the Goyal et al. recipe (see module doc).

    Re-initialises parameters that already have data. If some shapes are still unknown, a
    first pass sets every parameter to zeros and runs one forward pass to infer them. Then
    ``mx.random`` (all devices) and ``np.random`` are seeded with ``seed`` and every parameter
    is drawn in registration order, so the values depend only on ``seed`` and the architecture:
    not on deferral, hybridization or an earlier initialisation.

    Args:
        net: the network, e.g. from :func:`mxlarge.nets.build_net`.
        cfg: which rules to apply (``he_init``, ``fc_init_std``, ``zero_gamma``).
        seed: random seed.
        ctx: a context or list of contexts (default: the current context).
        input_shape: ``(C, H, W)`` of one input. Needed when some shapes are only known at the
            first forward (GluonCV models, the stem of ``small_resnet``): a batch of one zero
            image is run in inference mode, which leaves the BN running statistics alone.

    Returns:
        An :class:`InitReport`.

    Raises:
        ValueError: if shapes are deferred and ``input_shape`` is missing.
    """
    ctxs = ([mx.current_context()] if ctx is None
            else list(ctx) if isinstance(ctx, (list, tuple)) else [ctx])

    blocks = residual_blocks(net)
    zeroed: dict[int, nn.BatchNorm] = {}
    skipped: list[tuple[str, str]] = []
    if cfg.zero_gamma:
        for block in blocks:
            bn = last_branch_batchnorm(block)
            if bn is None or _fix_gamma(bn):
                skipped.append((block.name, type(block).__name__))
            else:
                zeroed[id(bn)] = bn
    final = _final_dense(net) if cfg.fc_init_std > 0 else None

    plan: dict[str, tuple[mx.gluon.Parameter, mx.init.Initializer | None]] = {}

    def put(param: mx.gluon.Parameter | None, init: mx.init.Initializer | None) -> None:
        if param is not None:
            plan[param.name] = (param, init)  # None: the builder's default

    he_convs = 0
    for block in _walk(net):
        for param in block.params.values():
            put(param, mx.init.Zero() if param.name.endswith("bias") else None)
        if isinstance(block, _CONVS):
            if cfg.he_init:
                put(block.weight, he_initializer())
                he_convs += 1
        elif isinstance(block, nn.Dense) and final is not None and block is final:
            put(block.weight, mx.init.Normal(sigma=cfg.fc_init_std))
        elif isinstance(block, _NORMS):
            put(block.gamma, mx.init.Zero() if id(block) in zeroed else mx.init.One())
            put(block.beta, mx.init.Zero())
            put(block.running_mean, mx.init.Zero())
            put(block.running_var, mx.init.One())
    # Parameters not owned by any block in the tree (rare: shared from elsewhere).
    for param in net.collect_params().values():
        if param.name not in plan:
            put(param, mx.init.Zero() if param.name.endswith("bias") else None)

    if not all(_shape_known(p) for p, _ in plan.values()):
        if input_shape is None:
            missing = [p.name for p, _ in plan.values() if not _shape_known(p)]
            raise ValueError(f"{net.name}: parameter shapes are only known after a forward pass "
                             f"({', '.join(missing[:3])}, ...); pass input_shape=(C, H, W)")
        # Shapes first (zeros, no random draws), values second: deferred parameters would
        # otherwise be drawn in forward order (imperative) or graph order (hybridized), not in
        # registration order, and the values would depend on that and on prior initialisation.
        for param, _ in plan.values():
            param.initialize(init=mx.init.Zero(), ctx=ctxs, force_reinit=True)
        with mx.autograd.pause(train_mode=False):
            net(mx.nd.zeros((1, *input_shape), ctx=ctxs[0]))

    mx.random.seed(seed)
    np.random.seed(seed)
    for param, init in plan.values():
        param.initialize(init=init, ctx=ctxs, default_init=DEFAULT_INIT, force_reinit=True)
    mx.nd.waitall()

    report = InitReport(
        he_convs=he_convs,
        final_dense=final.weight.name if final is not None else None,
        zero_gamma=tuple(bn.gamma.name for bn in zeroed.values()),
        residual_blocks=len(blocks),
        skipped=tuple(skipped),
    )
    log.info("init %s: %d He convs, final dense %s, zero gamma in %d/%d residual blocks",
             net.name, report.he_convs, report.final_dense, len(report.zero_gamma),
             report.residual_blocks)
    return report
