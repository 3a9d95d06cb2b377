"""The pretrained encoder as a dense-prediction backbone: ViTDet's simple feature pyramid over a plain
ViT (Li et al., "Exploring Plain Vision Transformer Backbones for Object Detection", 2022, Fig. 2c).

From one stride-``p`` map (the last block's, or a chosen block's) the pyramid builds maps at 4x, 2x,
1x and 1/2x that resolution: two 2x2 stride-2 deconvolutions (LayerNorm and GELU between them), one,
none, and a 2x2 max-pool. Each is projected to ``out_channels`` by a 1x1 and a 3x3 convolution, each
followed by a LayerNorm over channels, as ViTDet does; a last map max-pooled from the coarsest one
(detectron2's and torchvision's ``LastLevelMaxPool``) makes five. The output is the ``OrderedDict``
``{"0", "1", "2", "3", "pool"}`` with ``out_channels``, the interface of torchvision's FPN backbones,
so ``FasterRCNN``, ``MaskRCNN`` and ``RetinaNet`` take it as ``backbone=`` as they are.

As in ViTDet, the encoder runs on the patch tokens only: the pretrained cls token is left out (its
position embedding with it). Optionally, most blocks attend within windows (``mae.dense.models.windows``), and
the four maps can come from four blocks (the BEiT / MAE segmentation setting) instead of one.
"""

import inspect
from collections import OrderedDict
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch
from timm.layers import LayerNorm2d, to_2tuple
from timm.models.vision_transformer import VisionTransformer
from torch import nn
from torch.nn import functional as F
from torch.utils.checkpoint import checkpoint

from mae.compat.timm import embed_positions
from mae.convert.backbone import load_backbone, pooling_of
from mae.convert.sources import MAECheckpoint, read_checkpoint
from mae.dense.models.cnn_pyramid import CNNFeaturePyramid
from mae.dense.models.windows import block_in_windows, default_global_blocks, window_position_bias
from mae.errors import ConfigError
from mae.training.settings import refuse_renamed_arguments, renamed_for

# The pyramid's scales relative to the ViT's stride-p map (ViTDet: strides 4, 8, 16, 32 for p = 16), and
# the scales a map can have (small patches, e.g. p = 4 on 64 px scenes, are better served one octave down).
SCALES = (4.0, 2.0, 1.0, 0.5)
AVAILABLE_SCALES = (4.0, 2.0, 1.0, 0.5, 0.25)
FEATURE_NAMES = ("0", "1", "2", "3", "pool")  # torchvision's FPN backbone keys
# This pyramid's own settings (DenseTrainingModule's too) and their defaults: a CNN's pyramid
# (``CNNFeaturePyramid``) has no use for them, so any other value is refused for it by name.
VIT_PYRAMID_DEFAULTS: dict[str, Any] = {
    "block": None,
    "window_size": None,
    "global_blocks": None,
    "relative_position": False,
    "scales": SCALES,
    "max_tokens": None,
}


def _rescale(dim: int, scale: float) -> tuple[nn.Module, int]:
    """(module, channels out) that turns a (N, dim, h, w) map into one at ``scale`` x its resolution."""
    if scale == 4.0:
        layers = nn.Sequential(
            nn.ConvTranspose2d(dim, dim // 2, 2, stride=2),
            LayerNorm2d(dim // 2),
            nn.GELU(),
            nn.ConvTranspose2d(dim // 2, dim // 4, 2, stride=2),
        )
        return layers, dim // 4
    if scale == 2.0:
        return nn.ConvTranspose2d(dim, dim // 2, 2, stride=2), dim // 2
    if scale == 1.0:
        return nn.Identity(), dim
    if scale in (0.5, 0.25):
        return nn.MaxPool2d(round(1 / scale), stride=round(1 / scale)), dim
    raise ConfigError(f"pyramid scale {scale} is not one of {AVAILABLE_SCALES}")


def check_encoder(vit: VisionTransformer) -> None:
    """Raises ValueError when the pyramid cannot run on ``vit``: a width the 4x deconvolutions cannot
    split, or an encoder that takes one input size only."""
    if vit.embed_dim % 4:
        raise ConfigError(
            f"the encoder's width {vit.embed_dim} must be divisible by 4 for the 4x deconvolutions"
        )
    if not getattr(vit, "dynamic_img_size", False):
        raise ConfigError(
            "the feature pyramid takes inputs of any size: build its encoder with dynamic_img_size=True "
            "(mae.load_backbone(..., dynamic_img_size=True), as mae.dense.models.pyramid.feature_pyramid "
            "does)"
        )


def checked_scales(scales: Sequence[float]) -> tuple[float, ...]:
    """The four maps' scales as floats. Raises ValueError unless there are four, finest first."""
    checked = tuple(float(scale) for scale in scales)
    if len(checked) != len(SCALES) or list(checked) != sorted(checked, reverse=True):
        raise ConfigError(
            f"pyramid scales must be {len(SCALES)} scales from the finest down, e.g. {SCALES}; "
            f"got {tuple(scales)}"
        )
    return checked


def _check_block_indices(blocks: Sequence[int], depth: int, what: str) -> None:
    for b in blocks:
        if not 0 <= b < depth:
            raise ConfigError(f"{what} {b} is not one of the encoder's {depth} blocks (0 .. {depth - 1})")


def checked_blocks(block: int | Sequence[int] | None, depth: int) -> tuple[int, ...]:
    """The block feeding each of the four maps: ``block`` (the last of ``depth`` when None) for all, or
    one per map. Raises ValueError for another count or a block the encoder does not have."""
    if block is None:
        block = depth - 1
    blocks = (block,) * len(SCALES) if isinstance(block, int) else tuple(block)
    if len(blocks) != len(SCALES):
        raise ConfigError(f"pyramid block must be one block or {len(SCALES)} (one per scale); got {block}")
    _check_block_indices(blocks, depth, "pyramid block")
    return blocks


def checked_windows(
    window_size: int | None, global_blocks: Sequence[int] | None, relative_position: bool, depth: int
) -> tuple[int, ...]:
    """The global blocks of window attention (default: ``default_global_blocks``). Raises ValueError for
    a window size below 1, window settings without a window size, or a block the encoder does not have."""
    if window_size is not None and window_size < 1:
        raise ConfigError(f"window_size must be a positive number of patches, or None; got {window_size}")
    if window_size is None and global_blocks is not None:
        raise ConfigError("global_blocks only applies with window attention: set window_size too")
    if window_size is None and relative_position:
        raise ConfigError("relative_position is a bias inside attention windows: set window_size too")
    blocks = tuple(default_global_blocks(depth) if global_blocks is None else global_blocks)
    _check_block_indices(blocks, depth, "global block")
    return blocks


def trim_encoder(vit: VisionTransformer, last_block: int) -> None:
    """Drop, in place, what the maps do not use, so that every parameter gets a gradient (as DDP requires)
    and no compute goes to blocks past the last one used: the head, the final norms, later blocks."""
    vit.reset_classifier(0)
    vit.norm, vit.fc_norm = nn.Identity(), nn.Identity()
    vit.blocks = vit.blocks[: last_block + 1]


class SimpleFeaturePyramid(nn.Module):
    """ViTDet's simple feature pyramid over a timm ``VisionTransformer``.

    Args:
        vit: the encoder (``mae.load_backbone``'s, or any timm ViT) built with ``dynamic_img_size=True``:
            it is run on all patches, its position embeddings resampled to each input's patch grid.
        out_channels: channels of every output map (ViTDet: 256).
        block: the block whose output feeds the pyramid (default: the last, as ViTDet), or four blocks,
            one per scale from the finest (the MAE paper's segmentation setting, after BEiT: blocks
            3, 5, 7, 11 of ViT-B).
        window_size: ViTDet's window attention: blocks other than ``global_blocks`` attend within
            ``window_size x window_size`` patch windows (ViTDet: 14 for 1024 px at p = 16). None: every
            block attends globally.
        global_blocks: the blocks that keep global attention when ``window_size`` is set (default: the
            last of each quarter, ViTDet's 2, 5, 8, 11 for 12 blocks).
        relative_position: a learned relative position bias in each window block
            (``mae.dense.models.windows.window_position_bias``, zero at the start; its table is
            ``vit.blocks.<i>.window_position_bias``, so layer decay treats it as its block's). Needs
            ``window_size``; off by default (ViTDet's recipes turn their relative positions on).
        grad_checkpointing: recompute each block's activations in the backward pass instead of
            keeping them: far less memory at detection sizes (1024 px), about a third more compute. Its
            name until 0.4.0, ``activation_checkpointing``, is refused naming it.
        scales: the four maps' scales relative to the stride-p map, finest first (ViTDet: 4, 2, 1, 1/2;
            each of 4, 2, 1, 1/2, 1/4).
        max_tokens: the most patches one input may have (default ``default_max_tokens``). An input past it
            is refused naming its size: torchvision's detectors resize every image to ``min_size`` 800
            unless told, which turned a 64 px scene into 40,000 tokens of a p = 4 encoder and 24 GB in
            three steps. Give the detector ``**pyramid.detector_sizes()``, or raise this for inputs you
            know fit.

    The pyramid owns ``vit`` and trims it: its classifier head and final norm are removed (ViTDet uses
    neither), and blocks after the last one used.

    Input: (N, C, H, W) images of any size; the right and bottom are zero-padded to a multiple of the
    patch size (the maps cover the padded image). Output: ``OrderedDict`` of (N, out_channels, h_k, w_k)
    maps with strides ``p / 4``, ``p / 2``, ``p``, ``2p`` and ``4p`` (``strides``; with other ``scales``,
    p / scale for each and twice the coarsest).
    """

    def __init__(
        self,
        vit: VisionTransformer,
        out_channels: int = 256,
        block: int | Sequence[int] | None = None,
        window_size: int | None = None,
        global_blocks: Sequence[int] | None = None,
        grad_checkpointing: bool = False,
        scales: Sequence[float] = SCALES,
        relative_position: bool = False,
        max_tokens: int | None = None,
        **renamed: Any,
    ) -> None:
        refuse_renamed_arguments(renamed, SimpleFeaturePyramid)
        if renamed:
            raise TypeError(f"SimpleFeaturePyramid got unexpected keyword arguments: {', '.join(renamed)}")
        super().__init__()
        depth = len(vit.blocks)
        self.max_tokens = max_tokens or default_max_tokens(vit)
        self.pretraining_size = tuple(vit.patch_embed.img_size)
        check_encoder(vit)
        self.scales = checked_scales(scales)
        self.blocks = checked_blocks(block, depth)
        self.global_blocks = checked_windows(window_size, global_blocks, relative_position, depth)
        self.window_size = window_size
        dim = vit.embed_dim
        trim_encoder(vit, max(self.blocks))
        self.relative_position = relative_position
        if relative_position:
            for index, vit_block in enumerate(vit.blocks):
                if index not in self.global_blocks:
                    vit_block.window_position_bias = window_position_bias(
                        window_size, vit_block.attn.num_heads
                    )
        self.vit = vit
        self.grad_checkpointing = grad_checkpointing
        self.patch_size = vit.patch_embed.patch_size  # (ph, pw)
        self.out_channels = out_channels
        self.rescale = nn.ModuleList()
        self.project = nn.ModuleList()
        for scale in self.scales:
            rescale, channels = _rescale(dim, scale)
            self.rescale.append(rescale)
            self.project.append(
                nn.Sequential(
                    nn.Conv2d(channels, out_channels, 1, bias=False),
                    LayerNorm2d(out_channels),
                    nn.Conv2d(out_channels, out_channels, 3, padding=1, bias=False),
                    LayerNorm2d(out_channels),
                )
            )

    def detector_sizes(self) -> dict[str, int]:
        """``min_size`` / ``max_size`` for a torchvision detector on this pyramid: every image resized to the
        encoder's pretraining size on its longer side (``MaskRCNN(pyramid, num_classes, **sizes)``)."""
        side = max(self.pretraining_size)
        return {"min_size": side, "max_size": side}

    @property
    def encoder(self) -> VisionTransformer:
        """The encoder (``vit``), by the name every pyramid gives its own (``CNNFeaturePyramid``'s too)."""
        return self.vit

    @property
    def strides(self) -> tuple[float, ...]:
        """Each output map's stride in input pixels, in ``FEATURE_NAMES`` order."""
        p = self.patch_size[0]
        return (*(p / scale for scale in self.scales), 2 * p / self.scales[-1])

    def pad(self, images: torch.Tensor) -> torch.Tensor:
        """(N, C, H, W) zero-padded at the right and bottom to a multiple of the patch size."""
        ph, pw = self.patch_size
        height, width = images.shape[-2:]
        return F.pad(images, (0, -width % pw, 0, -height % ph))

    def encode(self, images: torch.Tensor) -> dict[int, torch.Tensor]:
        """The chosen blocks' outputs for (N, C, H, W) images (H, W multiples of the patch size):
        ``{block: (N, D, H / p, W / p)}``, the encoder run on patch tokens only."""
        vit = self.vit
        tokens = embed_positions(vit, vit.patch_embed(images))  # (N, prefix + h * w, D), embeddings resampled
        # ViTDet drops the cls token
        tokens = vit.norm_pre(vit.patch_drop(tokens))[:, vit.num_prefix_tokens :]
        n, _, height, width = images.shape
        h, w = height // self.patch_size[0], width // self.patch_size[1]
        tokens = tokens.reshape(n, h, w, -1)
        outputs = {}
        for index, block in enumerate(vit.blocks):
            tokens = self._run_block(index, block, tokens)
            if index in self.blocks:
                outputs[index] = tokens.permute(0, 3, 1, 2)
        return outputs

    def _run_block(self, index: int, block: nn.Module, tokens: torch.Tensor) -> torch.Tensor:
        """(N, h, w, D) tokens through one block, in windows unless it is a global block."""
        n, h, w, d = tokens.shape
        if self.window_size is not None and index not in self.global_blocks:
            bias = getattr(block, "window_position_bias", None)
            run = lambda t: block_in_windows(block, t, self.window_size, bias)  # noqa: E731
        else:
            run = lambda t: block(t.reshape(n, h * w, d)).reshape(n, h, w, d)  # noqa: E731
        if self.grad_checkpointing and self.training and torch.is_grad_enabled():
            return checkpoint(run, tokens, use_reentrant=False)
        return run(tokens)

    def forward(self, images: torch.Tensor) -> "OrderedDict[str, torch.Tensor]":
        ph, pw = self.patch_size
        patches = max(1, round(1 / self.scales[-1]))  # the coarsest map needs this many patches a side
        if images.shape[-2] <= (patches - 1) * ph or images.shape[-1] <= (patches - 1) * pw:
            raise ConfigError(
                f"images of {images.shape[-2]}x{images.shape[-1]} px are too small for the feature pyramid: "
                f"it needs {patches} patches of {ph}x{pw} px along each side (at least "
                f"{(patches - 1) * ph + 1}x{(patches - 1) * pw + 1} px)"
            )
        tokens = -(-images.shape[-2] // ph) * -(-images.shape[-1] // pw)
        if tokens > self.max_tokens:
            raise ConfigError(
                f"images of {images.shape[-2]}x{images.shape[-1]} px make {tokens:,} patches, over this "
                f"pyramid's max_tokens {self.max_tokens:,} (its encoder was pretrained at "
                f"{self.pretraining_size[0]}x{self.pretraining_size[1]}): torchvision's detectors resize "
                "images to min_size 800 unless told; pass min_size / max_size (pyramid.detector_sizes() "
                "gives the pretraining size), or raise max_tokens for inputs you know fit"
            )
        features = self.encode(self.pad(images))
        maps = [
            project(rescale(features[block]))
            for block, rescale, project in zip(self.blocks, self.rescale, self.project, strict=True)
        ]
        maps.append(F.max_pool2d(maps[-1], kernel_size=1, stride=2))  # torchvision's LastLevelMaxPool
        return OrderedDict(zip(FEATURE_NAMES, maps, strict=True))


def default_max_tokens(vit: VisionTransformer) -> int:
    """The patches one input of the pyramid over ``vit`` may have by default: 64 times its pretraining grid's,
    at least 4,096 (ViTDet's 1024 px at p = 16, from 224 px: 21 times)."""
    height, width = vit.patch_embed.grid_size
    return max(64 * height * width, 4096)


def check_cnn_pyramid_args(args: dict[str, Any], encoder: str) -> None:
    """Raises ConfigError when ``args`` set an option of this pyramid (``VIT_PYRAMID_DEFAULTS``) to anything
    but its default, naming it: the CNN ``encoder``'s pyramid (``CNNFeaturePyramid``) is its stage maps."""
    for name, default in VIT_PYRAMID_DEFAULTS.items():
        value = args.get(name, default)
        if name == "scales" and value is not None:
            same = tuple(float(scale) for scale in value) == default
        else:
            same = value == default
        if not same:
            raise ConfigError(
                f"model.{name} {value!r} is an option of the ViT's feature pyramid; {encoder} is a CNN, "
                f"whose pyramid is its own stride-4 to 32 stage maps under an FPN: leave model.{name} unset"
            )


def feature_pyramid(
    source: "str | Path | MAECheckpoint", *args: Any, **kwargs: Any
) -> "SimpleFeaturePyramid | CNNFeaturePyramid":
    """The feature pyramid of the pretrained encoder of ``source`` (any checkpoint format
    ``mae.load_backbone`` reads, fine-tuned classifiers included), as ``PYRAMIDS`` has it for its family:
    a ViT's ``SimpleFeaturePyramid``, a CNN's ``CNNFeaturePyramid``.

    ``args`` and the keyword arguments the pyramid takes (``out_channels``, ``block``, ``window_size``, ...;
    a CNN's: ``out_channels``, ``grad_checkpointing``, the ViT's options refused by name) go to the pyramid;
    the other keyword arguments to ``mae.load_backbone`` (``format``, ``in_chans``, ``drop_path_rate``,
    ...)."""
    pyramid_names = set(inspect.signature(SimpleFeaturePyramid).parameters) - {"vit", "renamed"}
    # an old name goes to the pyramid, which refuses it naming the new one
    pyramid_names |= {old.removeprefix("model.") for old in renamed_for(SimpleFeaturePyramid)}
    pyramid = {name: kwargs.pop(name) for name in list(kwargs) if name in pyramid_names}
    ckpt = source
    if not isinstance(ckpt, MAECheckpoint):
        ckpt = read_checkpoint(ckpt, kwargs.pop("format", "auto"))
    family = ckpt.family
    if family == "cnn":
        check_cnn_pyramid_args(pyramid, ckpt.config["encoder"])
        pyramid = {name: value for name, value in pyramid.items() if name not in VIT_PYRAMID_DEFAULTS}
        encoder = load_backbone(ckpt, global_pool="avg", **kwargs)
        size = tuple(to_2tuple(ckpt.config["img_size"]))  # the pretraining's
        return PYRAMIDS[family](encoder, *args, pretraining_size=size, **pyramid)
    vit = load_backbone(ckpt, global_pool=pooling_of(ckpt), dynamic_img_size=True, **kwargs)
    return PYRAMIDS[family](vit, *args, **pyramid)


# Each encoder family's pyramid: a ViT's built from one map, a CNN's from its own stage maps.
PYRAMIDS: dict[str, type[nn.Module]] = {"vit": SimpleFeaturePyramid, "cnn": CNNFeaturePyramid}
