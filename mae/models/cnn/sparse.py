"""Submanifold sparse convolution emulated with dense ops on an unmodified timm CNN (SparK, ConvNeXt-V2).

A masked image is a sparse set of visible cells on the mask grid. A sparse convolution computes outputs at
visible positions only, from visible inputs only. Dense ops give the same numbers when every masked
position is zero at each op's input and its output is put back to zero ("re-masked") after each op that
can make it non-zero: a convolution (its bias, and the visible neighbours it reads), pooling, a norm's
shift, a linear layer on channels-last maps, GRN's bias. Normalisation statistics are taken over the
visible positions only: BatchNorm's batch statistics (``SparseBatchNorm2d``, the one op whose numbers, not
only its zeros, differ from the dense op), and GRN's spatial norm, which the zeros leave out by themselves
(a sum of squares); LayerNorm normalises each position over its channels, so it never mixes positions.

``sparsify(model)`` prepares a timm CNN once: its BatchNorms become their sparse subclasses (same
parameters and buffers, same state-dict keys: the checkpoint stays the timm model's) and each re-masked op
gets a forward hook. Both read the mask of ``MaskContext``, set only for the duration of a masked forward:
with no mask set the model is exactly the timm model.

Ops that mix positions in ways this cannot emulate (GroupNorm, squeeze-and-excitation and other global
pooling inside the stages, attention) are refused by name.

References: Tian et al., "Designing BERT for Convolutional Networks: Sparse and Hierarchical Masked
Modeling" (SparK, ICLR 2023), Sec. 3.1; Woo et al., "ConvNeXt V2" (CVPR 2023), Sec. 3.1.
"""

from collections.abc import Callable, Iterator
from contextlib import contextmanager

import torch
from timm.layers import BatchNormAct2d, LayerNorm2d
from timm.layers.grn import GlobalResponseNorm
from torch import nn

from mae.errors import ConfigError


class MaskContext:
    """The visible cells of the batch being encoded, shared by every sparse op of one model.

    ``visible`` is (N, 1, h, w) bool on the mask grid (True = visible), or None (no masking: the dense
    model). ``at(size)`` gives it at a feature map's (H, W): repeated when the map is finer than the mask
    grid, and, where it is coarser, a position is visible when any cell it covers is.
    """

    def __init__(self) -> None:
        self.visible: torch.Tensor | None = None
        self._cache: dict[tuple, torch.Tensor] = {}

    def set(self, visible: torch.Tensor | None) -> None:
        """Compute sparsely on ``visible`` (N, 1, h, w) bool from now on, or densely (None)."""
        self.visible = visible
        self._cache = {}

    @contextmanager
    def masking(self, visible: torch.Tensor | None) -> Iterator[None]:
        """Inside the block, compute sparsely on ``visible`` (densely for None); after it, as before. Only a
        model's own forward sets a mask, so its encoder called directly afterwards (a monitor, an export)
        is the dense timm model."""
        before = self.visible
        self.set(visible)
        try:
            yield
        finally:
            self.set(before)

    def at(self, size: tuple[int, int]) -> torch.Tensor:
        """(N, 1, H, W) bool: the visible positions of a feature map of ``size`` (H, W)."""
        key = ("bool", int(size[0]), int(size[1]))
        if key not in self._cache:
            self._cache[key] = resize_mask(self.visible, key[1:])
        return self._cache[key]

    def multiplier(self, size: tuple[int, int], dtype: torch.dtype, channels_last: bool) -> torch.Tensor:
        """``at(size)`` as 1/0 of ``dtype``, (N, 1, H, W) or, ``channels_last``, (N, H, W, 1): what a
        re-masked op's output is multiplied by; made once a forward for each map size and layout."""
        key = ("multiplier", int(size[0]), int(size[1]), dtype, channels_last)
        if key not in self._cache:
            mask = self.at(size).to(dtype)
            self._cache[key] = mask.permute(0, 2, 3, 1) if channels_last else mask
        return self._cache[key]

    def indices(self, size: tuple[int, int]) -> torch.Tensor:
        """(K,) the flat indices, in (N, H, W) order, of the visible positions of a map of ``size``: found
        once a forward for each size (on a GPU, one host sync, not one per BatchNorm)."""
        key = ("indices", int(size[0]), int(size[1]))
        if key not in self._cache:
            self._cache[key] = self.at(size).flatten().nonzero().squeeze(1)
        return self._cache[key]


def resize_mask(visible: torch.Tensor, size: tuple[int, int]) -> torch.Tensor:
    """(N, 1, h, w) bool mask -> (N, 1, H, W) for a map of ``size`` whose sides are a whole multiple or a
    whole fraction of the mask grid's.

    Raises:
        ConfigError: a side that neither divides nor is divided by the mask grid's.
    """
    out = visible
    for dim, (grid, side) in enumerate(zip(visible.shape[-2:], size, strict=True), start=2):
        if side % grid == 0:
            out = out.repeat_interleave(side // grid, dim=dim)
        elif grid % side == 0:
            shape = list(out.shape)
            shape[dim : dim + 1] = [side, grid // side]
            out = out.reshape(shape).any(dim=dim + 1)
        else:
            raise ConfigError(
                f"a feature map of {size[0]}x{size[1]} positions does not tile the {visible.shape[-2]}x"
                f"{visible.shape[-1]} mask grid: give an input size divisible by the network's largest "
                "stride and by model.model_kwargs.mask_unit"
            )
    return out


class _SparseBatchNorm:
    """BatchNorm over the visible positions only: batch statistics (and the running estimates they update)
    from the visible positions, masked positions left zero. With no mask set, the dense BatchNorm."""

    mask_context: MaskContext

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        context = getattr(self, "mask_context", None)
        if context is None or context.visible is None:
            return super().forward(x)
        index = context.indices(x.shape[-2:])  # (K,) the visible positions of every image
        x_last = x.permute(0, 2, 3, 1)  # (N, H, W, C)
        kept = x_last.reshape(-1, x.shape[1]).index_select(0, index)  # (K, C)
        normed = super().forward(kept[:, :, None, None])[:, :, 0, 0]
        out = normed.new_zeros(x_last.numel() // x.shape[1], x.shape[1]).index_copy(0, index, normed)
        return out.reshape(x_last.shape).permute(0, 3, 1, 2)


class SparseBatchNorm2d(_SparseBatchNorm, nn.BatchNorm2d):
    """``nn.BatchNorm2d`` over visible positions only (``_SparseBatchNorm``)."""


class SparseBatchNormAct2d(_SparseBatchNorm, BatchNormAct2d):
    """timm's ``BatchNormAct2d`` (BatchNorm, then its activation and dropout) over visible positions only."""


# The BatchNorms made sparse, by their exact class: a subclass may change what its forward computes.
SPARSE_NORMS: dict[type[nn.Module], type[nn.Module]] = {
    nn.BatchNorm2d: SparseBatchNorm2d,
    BatchNormAct2d: SparseBatchNormAct2d,
}


def _channels_last(module: nn.Module) -> bool:
    """Whether ``module`` works on (N, H, W, C) maps: linear layers and LayerNorm (outside LayerNorm2d),
    GRN built channels-last."""
    if isinstance(module, GlobalResponseNorm):
        return module.channel_dim == -1
    if isinstance(module, LayerNorm2d):
        return False
    return isinstance(module, nn.Linear | nn.LayerNorm)


# The ops whose outputs are re-masked. Every other op an encoder runs must map zero to zero position by
# position (activations, dropout, identity) or be refused below.
REMASKED: tuple[type[nn.Module], ...] = (
    nn.Conv2d,
    nn.MaxPool2d,
    nn.AvgPool2d,
    nn.LayerNorm,  # LayerNorm2d included (a subclass)
    nn.Linear,
    GlobalResponseNorm,
)

# Ops that mix positions in ways masked dense ops cannot emulate: statistics or weights over whole maps.
MIXING: tuple[type[nn.Module], ...] = (
    nn.GroupNorm,
    nn.InstanceNorm2d,
    nn.AdaptiveAvgPool2d,
    nn.AdaptiveMaxPool2d,
    nn.MultiheadAttention,
    nn.Upsample,
)
MIXING_NAMES = ("SEModule", "EffectiveSEModule", "EcaModule", "CecaModule", "CbamModule", "GatherExcite")
MIXING_NAMES += ("SelectiveKernel", "SelectAdaptivePool2d", "Attention", "SqueezeExcite", "GlobalContext")


def check_sparsifiable(used: list[tuple[str, nn.Module]], name: str) -> None:
    """Raise ``ConfigError`` naming the first op of ``used`` (the (path, module) pairs an encoder's
    forward runs) that sparse emulation cannot take: an op mixing positions, a BatchNorm of a class it does
    not know, a layer with weights it does not re-mask, or a weightless op that maps zero to non-zero."""
    for path, module in used:
        why = _not_sparsifiable(module)
        if why:
            raise ConfigError(
                f"model.model_kwargs.encoder {name}: its {path} ({type(module).__name__}) {why}, which "
                "masked dense convolution cannot emulate; sparse masked pretraining takes CNNs of "
                "convolutions, pooling, BatchNorm, LayerNorm, GRN and zero-preserving activations "
                "(ResNets, ConvNeXts, ConvNeXt-V2s)"
            )


def _not_sparsifiable(module: nn.Module) -> str | None:
    """Why one op cannot be emulated sparsely, or None."""
    kind = type(module)
    if isinstance(module, MIXING) or kind.__name__ in MIXING_NAMES:
        return "mixes positions (statistics or weights over the whole map)"
    if isinstance(module, nn.modules.batchnorm._BatchNorm):
        known = kind in SPARSE_NORMS or kind in SPARSE_NORMS.values()
        return None if known else "is a BatchNorm of a class without a sparse counterpart"
    if isinstance(module, REMASKED) or next(module.children(), None) is not None:
        return None  # re-masked, or a container whose leaves are checked one by one
    if next(module.parameters(recurse=False), None) is not None:
        return "has weights but is not an op masked positions are re-zeroed after"
    try:
        zero = module(torch.zeros(1, 1, 2, 2, device="cpu"))  # on the CPU whatever the default device
    except Exception:  # an op that takes other inputs: not an elementwise activation, judged by its leaves
        return None
    if isinstance(zero, torch.Tensor) and zero.is_floating_point() and bool(zero.abs().sum() > 0):
        return "maps zero to non-zero (masked positions would not stay empty)"
    return None


def sparsify(encoder: nn.Module, used: list[tuple[str, nn.Module]], context: MaskContext) -> None:
    """Make ``encoder`` compute sparsely while ``context`` holds a mask: its BatchNorms among ``used``
    switched to their sparse classes (parameters, buffers and state-dict keys unchanged) and each re-masked
    op's output multiplied by the visible positions. ``used`` must pass ``check_sparsifiable``.

    Each op reads the context from its own ``mask_context`` attribute, never from a closure, so a deep copy
    of the model (an EMA copy) reads its own copy of the context."""
    for _, module in used:
        sparse = SPARSE_NORMS.get(type(module))
        if sparse is not None:
            module.__class__ = sparse
            module.mask_context = context
        elif isinstance(module, REMASKED):
            module.mask_context = context
            module.register_forward_hook(remask_output)


def remask_output(module: nn.Module, args: tuple, out: torch.Tensor) -> torch.Tensor | None:
    """Forward hook: ``out`` with every masked position zero, while the module's context holds a mask."""
    context = module.mask_context
    if context.visible is None or out.ndim != 4:
        return None
    channels_last = _channels_last(module)
    size = out.shape[1:3] if channels_last else out.shape[-2:]
    return out * context.multiplier(size, out.dtype, channels_last)


def leaf_modules_run(encoder: nn.Module, run: Callable[[], object]) -> list[tuple[str, nn.Module]]:
    """The (path, module) pairs of ``encoder`` that ``run()`` calls, leaves and containers, in call order
    (each once): what a forward of the encoder uses, its classifier head left out when ``run`` does."""
    names = {module: path for path, module in encoder.named_modules()}
    called: dict[nn.Module, str] = {}

    def record(module: nn.Module, args: tuple) -> None:
        called.setdefault(module, names[module])

    handles = [module.register_forward_pre_hook(record) for module in names]
    try:
        run()
    finally:
        for handle in handles:
            handle.remove()
    return [(path, module) for module, path in called.items() if path]


def mask_pixels(imgs: torch.Tensor, visible: torch.Tensor) -> torch.Tensor:
    """(N, C, H, W) images with every masked cell's pixels zero; ``visible`` (N, 1, h, w) bool."""
    return imgs * resize_mask(visible, imgs.shape[-2:]).to(imgs.dtype)
