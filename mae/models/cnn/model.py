"""Masked pretraining of a timm CNN: the MAE family's convolutional member (SparK, ConvNeXt-V2's FCMAE).

The paper's steps, one method each, as in ``MaskedAutoencoderViT``: masking on the network's coarsest
grid (``visible_cells``: the same strategies and rounding as the ViT's patches), the encoder on the
visible cells only (``forward_encoder``: the timm model itself, computing sparsely through
``mae.models.cnn.sparse``), the decoder with mask tokens (``forward_decoder``, a member of
``mae.models.cnn.decoders.CNN_DECODERS``), the loss on the masked cells (``forward_loss``) against the
per-cell target (``mae.models.targets``; a cell of ``mask_unit`` px is the ViT's patch).

The encoder is ``timm.create_model(encoder, num_classes=0)``: its state dict, under ``encoder.``, is the
timm model's, so the trained weights load into timm strictly. Unlike the ViT's, its masking saves no
FLOPs: every convolution runs densely over the whole map, masked positions held at zero.

References: Tian et al., SparK (ICLR 2023); Woo et al., ConvNeXt V2 (CVPR 2023).
"""

from typing import Any, ClassVar

import timm
import torch
from timm.layers import to_2tuple
from torch import nn
from torch.utils.checkpoint import checkpoint

from mae.errors import ConfigError
from mae.models.cnn.decoders import CNN_DECODERS, DecoderShape
from mae.models.cnn.sparse import MaskContext, check_sparsifiable, leaf_modules_run, mask_pixels, sparsify
from mae.models.loss import masked_patch_mse
from mae.models.masking import (
    MaskStrategy,
    check_mask_ratio,
    check_mask_strategy,
    check_strategy_grid,
    check_visible_patches,
    num_kept,
    sample_noise,
)
from mae.models.targets import build_target
from mae.models.targets.pixel import patchify, unpatchify

# The ViT decoder switches a CNN model is built with by the pretraining module: only their paper values.
_VIT_SWITCHES = {"decoder_type": "self", "decoder_keep_ratio": 1.0, "decoder_encoder_layers": None}


class MaskedAutoencoderCNN(nn.Module):
    """Masked autoencoder on a timm CNN.

    Args:
        encoder: a timm model name whose model gives multi-scale maps (``forward_intermediates``):
            ``resnet*``, ``convnext*``, ``convnextv2*``, ...; built at random initialisation.
        decoder: "spark" (SparK's light hierarchical decoder; pixel targets) or "fcmae" (ConvNeXt-V2's
            one-block decoder; any target).
        img_size: input size (H, W) or an int; divisible by the encoder's largest stride and ``mask_unit``.
        in_chans: input channels C.
        mask_unit: side in px of one mask cell, the patch of the loss: the encoder's largest stride (32)
            in the papers; a divisor of it (16, 8) masks finer, for small inputs.
        decoder_width: the decoder's width (spark: at the coarsest scale, halved per upsampling; 768 in
            SparK. fcmae: 512 in ConvNeXt-V2).
        decoder_depth: fcmae's ConvNeXt-V2 blocks (1 in the paper); spark's depth follows the stride.
        target: what the decoder regresses for each cell (``mae.models.targets.TARGETS``), "norm_pix" by
            default as in both papers.
        target_options: the target's options (``features``' teacher widths), as ``MaskedAutoencoderViT``'s.
        mask_strategy: which cells are masked: "random" (both papers), "block" or "grid".
        encoder_kwargs: further ``timm.create_model`` arguments of the encoder (``drop_path_rate``, ...).
        decoder_type, decoder_keep_ratio, decoder_encoder_layers: the ViT's decoder switches; only their
            paper values, which the pretraining module passes to every model.
    """

    family: ClassVar[str] = "cnn"

    def __init__(
        self,
        encoder: str = "resnet50",
        decoder: str = "spark",
        img_size: int | tuple[int, int] = 224,
        in_chans: int = 3,
        mask_unit: int = 32,
        decoder_width: int = 768,
        decoder_depth: int = 1,
        target: str = "norm_pix",
        target_options: dict[str, Any] | None = None,
        mask_strategy: MaskStrategy = "random",
        encoder_kwargs: dict[str, Any] | None = None,
        decoder_type: str = "self",
        decoder_keep_ratio: float = 1.0,
        decoder_encoder_layers: list[int] | None = None,
    ) -> None:
        super().__init__()
        switches = dict(
            decoder_type=decoder_type,
            decoder_keep_ratio=decoder_keep_ratio,
            decoder_encoder_layers=decoder_encoder_layers,
        )
        for key, value in switches.items():
            if value != _VIT_SWITCHES[key]:
                raise ConfigError(
                    f"model.{key} {value!r} is a switch of the ViT's decoder; a CNN model's decoder is "
                    f"model.model_kwargs.decoder ({' or '.join(CNN_DECODERS)}): leave {key} at "
                    f"{_VIT_SWITCHES[key]!r}"
                )
        if decoder not in CNN_DECODERS:
            raise ConfigError(
                f"model.model_kwargs.decoder must be one of {', '.join(CNN_DECODERS)}; got {decoder!r}"
            )
        check_mask_strategy(mask_strategy, "mask_strategy")
        img_size = to_2tuple(img_size)
        self.config = dict(
            family=self.family,
            encoder=encoder,
            decoder=decoder,
            img_size=tuple(img_size),
            in_chans=in_chans,
            mask_unit=mask_unit,
            decoder_width=decoder_width,
            decoder_depth=decoder_depth,
            target=target,
            mask_strategy=mask_strategy,
            encoder_kwargs=dict(encoder_kwargs or {}),
        )
        if target_options is not None:
            self.config["target_options"] = dict(target_options)
        self.mask_strategy = mask_strategy
        self.grad_checkpointing = False
        self.encoder = build_encoder(encoder, in_chans, encoder_kwargs)
        self.channels = [int(info["num_chs"]) for info in self.encoder.feature_info]
        self.reductions = [int(info["reduction"]) for info in self.encoder.feature_info]
        self.stride = self.reductions[-1]
        if mask_unit < 1 or self.stride % mask_unit:
            raise ConfigError(
                f"model.model_kwargs.mask_unit {mask_unit} must divide {encoder}'s largest stride "
                f"{self.stride} (the papers mask on that grid: mask_unit {self.stride})"
            )
        self.img_size = self._checked_size(img_size)
        check_strategy_grid(mask_strategy, self.grid_size)

        # The ops one forward of the encoder runs (its classifier head left out), checked and made sparse.
        used = leaf_modules_run(self.encoder, lambda: _dry_run(self.encoder, in_chans, self.stride))
        check_sparsifiable(used, encoder)
        self.mask_context = MaskContext()
        sparsify(self.encoder, used, self.mask_context)
        _freeze_unused(self.encoder, [module for _, module in used])

        self.target = build_target(target, mask_unit, in_chans, target_options)
        decoder_class = CNN_DECODERS[decoder]
        if decoder_class.pixels_only and not self.target.pixels:
            raise ConfigError(
                f"model.target {target} is not pixels, and the {decoder} decoder draws pixels: take target "
                "pixel or norm_pix, or model.model_kwargs.decoder fcmae"
            )
        shape = DecoderShape(
            channels=tuple(self.channels),
            reductions=tuple(self.reductions),
            mask_unit=mask_unit,
            in_chans=in_chans,
            target_dim=self.target.dim,
            width=decoder_width,
            depth=decoder_depth,
            batch_norm=any(isinstance(module, nn.BatchNorm2d) for _, module in used),
        )
        self.decoder = decoder_class(shape, self.mask_context)

    def _checked_size(self, img_size: tuple[int, int]) -> tuple[int, int]:
        step = self.stride
        if any(side < step or side % step for side in img_size):
            raise ConfigError(
                f"data.img_size {img_size[0]}x{img_size[1]} must be a positive multiple of "
                f"{self.config['encoder']}'s largest stride {step} on each side"
            )
        return tuple(int(side) for side in img_size)

    # ------------------------------------------------------------------ the model's geometry
    @property
    def patch_size(self) -> int:
        """p: the side in px of one mask cell (``mask_unit``), the patch of the loss and of ``patchify``."""
        return self.config["mask_unit"]

    @property
    def grid_size(self) -> tuple[int, int]:
        """(H/p, W/p): the mask grid."""
        return (self.img_size[0] // self.patch_size, self.img_size[1] // self.patch_size)

    @property
    def num_patches(self) -> int:
        """L: the cells of the mask grid."""
        return self.grid_size[0] * self.grid_size[1]

    @property
    def norm_pix_loss(self) -> bool:
        return self.target.name == "norm_pix"

    def set_img_size(self, img_size: int | tuple[int, int]) -> None:
        """Take inputs of ``img_size`` from now on: a convolutional network has no position embedding, only
        its mask grid changes. ``config["img_size"]`` stays as built."""
        size = self._checked_size(to_2tuple(img_size))
        grid = (size[0] // self.patch_size, size[1] // self.patch_size)
        check_strategy_grid(self.mask_strategy, grid)
        self.img_size = size

    def set_grad_checkpointing(self, enable: bool = True) -> None:
        """Activation checkpointing of the masked encoder, as one segment: while autograd records, only its
        input and its maps are kept, and it runs again in the backward pass, with its mask set again (a
        segment of timm's own, per stage, would rerun after the mask is cleared: dense, wrong gradients).
        The decoder is light and runs as is. Gradients are those without it; BatchNorm's running estimates
        are updated by the rerun too, as with any checkpointed BatchNorm."""
        self.grad_checkpointing = enable

    def patchify(self, imgs: torch.Tensor) -> torch.Tensor:
        """(N, C, H, W) -> (N, L, p*p*C) cells, row-major, pixels ordered (p, p, C) as the ViT's patches."""
        return patchify(imgs, self.patch_size)

    def unpatchify(self, x: torch.Tensor) -> torch.Tensor:
        """(N, L, p*p*C) cells -> (N, C, H, W); inverse of ``patchify``."""
        return unpatchify(x, self.patch_size, self.grid_size)

    # ------------------------------------------------------------------ masking
    def check_mask_ratio(self, mask_ratio: float) -> None:
        """Raise ``ConfigError`` for a ratio outside [0, 1), one the strategy cannot produce, or one that
        leaves no visible cell on the mask grid."""
        check_mask_ratio(mask_ratio, self.mask_strategy)
        check_visible_patches(self.grid_size, mask_ratio)

    def check_decoded_patches(self, mask_ratio: float) -> None:
        """Never raises: the decoder predicts every cell."""

    def sample_noise(
        self,
        batch_size: int,
        mask_ratio: float,
        device: torch.device | str = "cpu",
        generator: torch.Generator | None = None,
    ) -> torch.Tensor:
        """(N, L) masking scores of this model's strategy (small = visible)."""
        self.check_mask_ratio(mask_ratio)
        return sample_noise(self.mask_strategy, batch_size, self.grid_size, mask_ratio, device, generator)

    def visible_cells(
        self, batch_size: int, mask_ratio: float, noise: torch.Tensor | None, device: torch.device
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """The masking of a batch: the ``int(L * (1 - mask_ratio))`` cells of smallest ``noise`` are kept,
        as the ViT keeps its patches. Returns ``mask`` (N, L), 1 = masked, and the visible cells (N, 1, h, w)
        bool."""
        self.check_mask_ratio(mask_ratio)
        if noise is None:
            noise = sample_noise(self.mask_strategy, batch_size, self.grid_size, mask_ratio, device)
        rank = noise.argsort(dim=1).argsort(dim=1)
        masked = rank >= num_kept(self.num_patches, mask_ratio)
        visible = (~masked).reshape(batch_size, 1, *self.grid_size)
        return masked.to(noise.dtype if noise.is_floating_point() else torch.float32), visible

    # ------------------------------------------------------------------ the paper's steps
    def forward_encoder(self, imgs: torch.Tensor, visible: torch.Tensor | None) -> list[torch.Tensor]:
        """The encoder on the visible cells only: masked pixels zeroed, every op computing sparsely.

        Args:
            imgs: (N, C, H, W).
            visible: (N, 1, h, w) bool on the mask grid; None encodes densely (the timm model as it is).

        Returns:
            The encoder's maps (N, C_i, H/r_i, W/r_i), finest first, zero at masked positions.
        """
        if self.grad_checkpointing and visible is not None and torch.is_grad_enabled():
            return checkpoint(self._encode, imgs, visible, use_reentrant=False)
        return self._encode(imgs, visible)

    def _encode(self, imgs: torch.Tensor, visible: torch.Tensor | None) -> list[torch.Tensor]:
        with self.mask_context.masking(visible):
            if visible is not None:
                imgs = mask_pixels(imgs, visible)
            return self.encoder.forward_intermediates(imgs, intermediates_only=True)

    def forward_decoder(self, maps: list[torch.Tensor], visible: torch.Tensor) -> torch.Tensor:
        """(N, L, D_target) predicted targets of every cell, from the sparse ``maps`` and mask tokens."""
        return self.decoder(maps, visible)

    def forward_loss(self, imgs: torch.Tensor, pred: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        """MSE between ``pred`` (N, L, D_target) and the target of ``imgs``' cells, on masked cells only."""
        return masked_patch_mse(pred, self.target(imgs), mask)

    def forward(
        self,
        imgs: torch.Tensor,
        mask_ratio: float = 0.6,
        noise: torch.Tensor | None = None,
        decoder_noise: torch.Tensor | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Returns (loss, pred (N, L, D_target), mask (N, L), 1 = masked); ``noise`` (N, L) fixes the masks.
        ``decoder_noise`` (the ViT decoder variants') is ignored: every cell is predicted."""
        mask, visible = self.visible_cells(imgs.shape[0], mask_ratio, noise, imgs.device)
        with self.mask_context.masking(visible):  # the decoder's densifying norms read it too
            maps = self.forward_encoder(imgs, visible)
            pred = self.forward_decoder(maps, visible)
        return self.forward_loss(imgs, pred, mask), pred, mask

    def forward_features(self, imgs: torch.Tensor) -> list[torch.Tensor]:
        """The encoder on the whole image, no masking: its (N, C_i, H/r_i, W/r_i) maps, finest first."""
        return self.forward_encoder(imgs, None)


def build_encoder(name: str, in_chans: int, encoder_kwargs: dict[str, Any] | None) -> nn.Module:
    """``timm.create_model(name, num_classes=0, in_chans=in_chans, **encoder_kwargs)``.

    Raises:
        ConfigError: a name timm does not know, or a model without multi-scale maps.
    """
    if not timm.is_model(name):
        raise ConfigError(
            f"model.model_kwargs.encoder {name!r} is not a timm model name (timm.list_models() lists them; "
            "CNNs such as resnet50, convnext_tiny, convnextv2_atto)"
        )
    kwargs = {**(encoder_kwargs or {}), "num_classes": 0, "in_chans": in_chans}
    model = timm.create_model(name, pretrained=False, **kwargs)
    if not hasattr(model, "forward_intermediates") or not hasattr(model, "feature_info"):
        raise ConfigError(
            f"model.model_kwargs.encoder {name}: timm's model gives no multi-scale maps "
            "(forward_intermediates)"
        )
    return model


def _freeze_unused(encoder: nn.Module, used: list[nn.Module]) -> None:
    """Parameters the encoder's maps never use (ConvNeXt's head norm) get no gradient: not trained, so
    DDP does not wait for them. They stay in the state dict, at timm's initialisation."""
    trained = {id(p) for module in used for p in module.parameters(recurse=False)}
    for p in encoder.parameters():
        if id(p) not in trained:
            p.requires_grad_(False)


def _dry_run(encoder: nn.Module, in_chans: int, side: int) -> None:
    """One forward of ``encoder``'s maps on a (1, C, side, side) zero image, in evaluation mode (no running
    statistic moves) and without autograd; on the encoder's device (the meta device included)."""
    training = encoder.training
    encoder.eval()
    try:
        with torch.no_grad():
            device = next(encoder.parameters()).device
            encoder.forward_intermediates(
                torch.zeros(1, in_chans, side, side, device=device), intermediates_only=True
            )
    finally:
        encoder.train(training)
