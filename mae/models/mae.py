"""The masked autoencoder: a ViT encoder on the visible patches, a light decoder with mask tokens.

Parameter names and layout are those of the official MAE model (``models_mae.py``), so its
checkpoints load with ``strict=True``; the encoder's names are timm ``VisionTransformer``'s.

The paper's steps, one method each: masking (``forward_encoder`` -> ``visible_tokens``, strategies in
``mae.models.masking``), the encoder on the visible tokens (``forward_encoder``), the decoder on them plus
mask tokens (``forward_decoder``), the loss on the masked patches (``forward_loss``) against the
per-patch target (``mae.models.targets``: the pixels, as the paper, or another). The decoder variants
of other papers (partial reconstruction, CrossMAE's cross-attention decoder) are subclasses in
``mae.models.decoder_variants``; ``mae.models.factory`` chooses the class from the decoder switches.

Reference: He et al., "Masked Autoencoders Are Scalable Vision Learners" (2021).
"""

from collections.abc import Callable
from functools import partial
from typing import Any

import torch
from timm.layers import PatchEmbed, to_2tuple
from timm.models import checkpoint, checkpoint_seq
from timm.models.vision_transformer import Block
from torch import nn

from mae.errors import ConfigError
from mae.models.decoder_switches import DecoderType, check_decoder_encoder_layers, check_decoder_type
from mae.models.loss import masked_patch_mse
from mae.models.masking import (
    MaskStrategy,
    check_decoder_keep_ratio,
    check_mask_ratio,
    check_mask_strategy,
    check_strategy_grid,
    check_visible_patches,
    random_masking,
    sample_noise,
)
from mae.models.patch_grid import check_img_size
from mae.models.pos_embed import sincos_2d
from mae.models.targets import build_target
from mae.models.targets.pixel import patchify, unpatchify


class MaskedAutoencoderViT(nn.Module):
    """Masked autoencoder with a Vision Transformer backbone.

    Args:
        img_size: input size, an int for square images or (H, W); divisible by ``patch_size``.
        patch_size: patch side p in pixels.
        in_chans: input channels C.
        embed_dim: encoder width D.
        depth: encoder blocks.
        num_heads: encoder attention heads.
        decoder_embed_dim: decoder width.
        decoder_depth: decoder blocks.
        decoder_num_heads: decoder attention heads.
        mlp_ratio: MLP hidden width / block width, for encoder and decoder.
        norm_pix_loss: the official MAE's name of the target, kept for its callers and files: True is
            ``target="norm_pix"``, False ``target="pixel"``; None (the default) leaves it to ``target``.
        mask_strategy: how patches are chosen for removal: "random" (the paper's default),
            "block" (BEiT-style blocks) or "grid" (keep one patch of every 2x2 cell).
        layer_norm_eps: epsilon of every LayerNorm (1e-6 in the official factories).
        decoder_type: "self" (the paper: mask tokens and visible tokens self-attend together) or
            "cross" (CrossMAE: mask-token queries cross-attend to the visible tokens, never to each other).
        decoder_keep_ratio: fraction of the masked patches the decoder reconstructs in training, in
            (0, 1]; the loss covers just those (1.0 = every one, the paper). Evaluation mode always
            reconstructs every masked patch, so validation losses and figures compare across settings.
        decoder_encoder_layers: cross decoder only: the encoder block (0-based, negative from the end)
            each decoder block reads, one per decoder block and the last among them; None = every
            block reads the encoder's output (CrossMAE's learned mixing of layers is left out).
        target: what the decoder regresses for each patch, a name of ``mae.models.targets.TARGETS``:
            "pixel" (the paper's plain target), "norm_pix" (per-patch normalised pixels, as the paper's
            released models), "hog" (MaskFeat's histograms of oriented gradients) or "features" (a frozen
            teacher's tokens); ``decoder_pred`` is sized by its width. None: from ``norm_pix_loss``, else
            "pixel".
        target_options: the target's options (``PatchTarget.option_names``): ``features`` needs its
            ``dim`` (the teacher's width) and takes ``block``, ``normalize`` and ``teacher`` (the teacher's
            identity); the teacher itself is handed to ``self.target.set_teacher``, never stored here. None
            for the other targets. Recorded in ``config`` only when given.

    This class is the paper's decoder (``"self"``, 1.0, None); the other switch values are its subclasses
    in ``mae.models.decoder_variants``, which ``create_model`` and ``build_mae`` choose.
    """

    def __init__(
        self,
        img_size: int | tuple[int, int] = 224,
        patch_size: int = 16,
        in_chans: int = 3,
        embed_dim: int = 1024,
        depth: int = 24,
        num_heads: int = 16,
        decoder_embed_dim: int = 512,
        decoder_depth: int = 8,
        decoder_num_heads: int = 16,
        mlp_ratio: float = 4.0,
        norm_pix_loss: bool | None = None,
        mask_strategy: MaskStrategy = "random",
        layer_norm_eps: float = 1e-6,
        decoder_type: DecoderType = "self",
        decoder_keep_ratio: float = 1.0,
        decoder_encoder_layers: list[int] | None = None,
        target: str | None = None,
        target_options: dict[str, Any] | None = None,
    ) -> None:
        super().__init__()
        img_size = to_2tuple(img_size)
        target = _target_name(target, norm_pix_loss)
        # Constructor arguments, so checkpoints and exports can rebuild this exact architecture.
        self.config = dict(
            img_size=tuple(img_size),
            patch_size=patch_size,
            in_chans=in_chans,
            embed_dim=embed_dim,
            depth=depth,
            num_heads=num_heads,
            decoder_embed_dim=decoder_embed_dim,
            decoder_depth=decoder_depth,
            decoder_num_heads=decoder_num_heads,
            mlp_ratio=mlp_ratio,
            target=target,
            mask_strategy=mask_strategy,
            layer_norm_eps=layer_norm_eps,
            decoder_type=decoder_type,
            decoder_keep_ratio=decoder_keep_ratio,
            decoder_encoder_layers=decoder_encoder_layers,
        )
        if target_options is not None:  # absent otherwise: every other model's record stays as it was
            self.config["target_options"] = dict(target_options)
        check_img_size(img_size, patch_size)
        for name, dim, heads in (
            ("", embed_dim, num_heads),
            ("decoder_", decoder_embed_dim, decoder_num_heads),
        ):
            if dim % heads:
                raise ConfigError(f"{name}embed_dim {dim} is not divisible by {name}num_heads {heads}")
            if dim % 4:
                raise ConfigError(
                    f"{name}embed_dim {dim} must be divisible by 4 for 2-D sin-cos position embeddings"
                )
        check_mask_strategy(mask_strategy, "mask_strategy")
        check_decoder_type(decoder_type, "decoder_type")
        check_decoder_keep_ratio(decoder_keep_ratio, "decoder_keep_ratio")
        layers = check_decoder_encoder_layers(decoder_type, decoder_encoder_layers, depth, decoder_depth)
        self.config["decoder_encoder_layers"] = self.decoder_encoder_layers = layers  # a list, counted from 0
        if not self.implements(decoder_type, decoder_keep_ratio):
            raise ConfigError(
                f"{type(self).__name__} does not implement decoder_type {decoder_type!r} with "
                f"decoder_keep_ratio {decoder_keep_ratio}; build the model with "
                "mae.models.build_mae(**arguments) or create_model(name, **arguments), which choose the "
                "decoder variant's class"
            )
        self.mask_strategy = mask_strategy
        self.decoder_type = decoder_type
        self.decoder_keep_ratio = decoder_keep_ratio
        self.grad_checkpointing = False  # a way of training, not of the architecture: not in config
        norm_layer = partial(nn.LayerNorm, eps=layer_norm_eps)

        # Encoder: exactly timm VisionTransformer's parts and names.
        self.patch_embed = PatchEmbed(img_size, patch_size, in_chans, embed_dim)
        grid_size = self.patch_embed.grid_size
        check_strategy_grid(mask_strategy, grid_size)
        self.cls_token = nn.Parameter(torch.zeros(1, 1, embed_dim))
        # Fixed sin-cos position embeddings: buffers, so no optimizer ever sees them.
        self.register_buffer("pos_embed", sincos_2d(embed_dim, grid_size).unsqueeze(0))
        self.blocks = vit_blocks(embed_dim, num_heads, depth, mlp_ratio, norm_layer)
        self.norm = norm_layer(embed_dim)

        # Decoder
        self.decoder_embed = nn.Linear(embed_dim, decoder_embed_dim)
        self.mask_token = nn.Parameter(torch.zeros(1, 1, decoder_embed_dim))
        self.register_buffer("decoder_pos_embed", sincos_2d(decoder_embed_dim, grid_size).unsqueeze(0))
        self.decoder_blocks = self.build_decoder_blocks(
            decoder_embed_dim, decoder_num_heads, decoder_depth, mlp_ratio, norm_layer
        )
        self.decoder_norm = norm_layer(decoder_embed_dim)
        # No parameters, nor a teacher's: nothing in the state dict.
        self.target = build_target(target, patch_size, in_chans, target_options)
        self.decoder_pred = nn.Linear(decoder_embed_dim, self.target.dim)

        self.initialize_weights()

    @classmethod
    def implements(cls, decoder_type: str, decoder_keep_ratio: float) -> bool:
        """Whether this class is the decoder these switches name: here the paper's, every masked patch
        reconstructed by self-attention."""
        return decoder_type == "self" and decoder_keep_ratio == 1.0

    def build_decoder_blocks(
        self, dim: int, num_heads: int, depth: int, mlp_ratio: float, norm_layer: Callable[[int], nn.Module]
    ) -> nn.Module:
        """The decoder's transformer blocks: the paper's are the encoder's kind."""
        return vit_blocks(dim, num_heads, depth, mlp_ratio, norm_layer)

    def set_grad_checkpointing(self, enable: bool = True) -> None:
        """Activation checkpointing of every encoder and decoder block (timm's method name): while autograd
        records, each block keeps only its input and is run again in the backward pass, so a step holds one
        block's activations instead of all of them, for about one more forward pass of compute. Losses and
        gradients are those without it (non-reentrant ``torch.utils.checkpoint``, which restores the RNG
        state for the rerun)."""
        self.grad_checkpointing = enable

    def run_blocks(self, blocks: nn.Sequential, x: torch.Tensor) -> torch.Tensor:
        """``blocks(x)``, each block checkpointed when ``grad_checkpointing`` is on."""
        if self.grad_checkpointing and torch.is_grad_enabled():
            return checkpoint_seq(blocks, x, use_reentrant=False)
        return blocks(x)

    def run_block(self, block: nn.Module, *inputs: torch.Tensor) -> torch.Tensor:
        """``block(*inputs)``, checkpointed when ``grad_checkpointing`` is on (blocks run one by one)."""
        if self.grad_checkpointing and torch.is_grad_enabled():
            return checkpoint(block, *inputs, use_reentrant=False)
        return block(*inputs)

    def set_img_size(self, img_size: int | tuple[int, int]) -> None:
        """Take inputs of ``img_size`` from now on (same patch size): the patch grid and both fixed sin-cos
        position embeddings are those of a model built at that size (recomputed, not interpolated); every
        learned weight stays. ``config["img_size"]`` (what checkpoints record) is left as built."""
        img_size = check_img_size(img_size, self.patch_size)
        grid_size = (img_size[0] // self.patch_size, img_size[1] // self.patch_size)
        check_strategy_grid(self.mask_strategy, grid_size)
        if grid_size == self.grid_size:
            return
        self.patch_embed.set_input_size(img_size=img_size)
        for name in ("pos_embed", "decoder_pos_embed"):
            old = getattr(self, name)
            setattr(self, name, sincos_2d(old.shape[-1], grid_size).unsqueeze(0).to(old))

    def initialize_weights(self) -> None:
        """Xavier-uniform linears and patch projection (as a linear), normal(0.02) tokens."""
        w = self.patch_embed.proj.weight
        nn.init.xavier_uniform_(w.view(w.shape[0], -1))
        nn.init.normal_(self.cls_token, std=0.02)
        nn.init.normal_(self.mask_token, std=0.02)
        self.apply(init_linear_and_norm)

    @property
    def norm_pix_loss(self) -> bool:
        """Whether the target is the per-patch normalised pixels (the official MAE's attribute)."""
        return self.target.name == "norm_pix"

    @property
    def patch_size(self) -> int:
        return self.patch_embed.patch_size[0]

    @property
    def grid_size(self) -> tuple[int, int]:
        """(H/p, W/p)."""
        return tuple(self.patch_embed.grid_size)

    @property
    def num_patches(self) -> int:
        """L = H/p * W/p."""
        return self.patch_embed.num_patches

    def patchify(self, imgs: torch.Tensor) -> torch.Tensor:
        """(N, C, H, W) images -> ``(N, L, p*p*C)`` patches, row-major, pixels ordered (p, p, C)."""
        return patchify(imgs, self.patch_size)

    def unpatchify(self, x: torch.Tensor) -> torch.Tensor:
        """``(N, L, p*p*C)`` patches -> (N, C, H, W) images; inverse of ``patchify``."""
        return unpatchify(x, self.patch_size, self.grid_size)

    def check_mask_ratio(self, mask_ratio: float) -> None:
        """Raise ``ValueError`` for a ratio this model cannot mask at: outside [0, 1), one its strategy
        cannot produce, or one that leaves no visible patch on its patch grid."""
        check_mask_ratio(mask_ratio, self.mask_strategy)
        check_visible_patches(self.grid_size, mask_ratio)

    def sample_noise(
        self,
        batch_size: int,
        mask_ratio: float,
        device: torch.device | str = "cpu",
        generator: torch.Generator | None = None,
    ) -> torch.Tensor:
        """(N, L) masking scores for this model's strategy (small score = visible patch), for a ratio
        this model can mask at (``check_mask_ratio``)."""
        self.check_mask_ratio(mask_ratio)
        return sample_noise(self.mask_strategy, batch_size, self.grid_size, mask_ratio, device, generator)

    def forward_encoder(
        self, imgs: torch.Tensor, mask_ratio: float, noise: torch.Tensor | None = None
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Encode the visible patches only.

        Args:
            imgs: (N, C, H, W).
            mask_ratio: fraction of patches removed, in [0, 1).
            noise: (N, L) masking scores (small = kept); drawn by ``mask_strategy`` when None.

        Returns:
            latent: (N, 1 + len_keep, D), normed, cls token first, ``len_keep = int(L * (1 - mask_ratio))``.
            mask: (N, L), 0 = visible, 1 = masked.
            ids_restore: (N, L) permutation that puts the shuffled tokens back in patch order.
        """
        x, mask, ids_restore = self.visible_tokens(imgs, mask_ratio, noise)
        x = self.run_blocks(self.blocks, x)
        x = self.norm(x)
        return x, mask, ids_restore

    def visible_tokens(
        self, imgs: torch.Tensor, mask_ratio: float, noise: torch.Tensor | None = None
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """The encoder's input: patches embedded, masked, the cls token in front. Arguments as
        ``forward_encoder``'s; returns the (N, 1 + len_keep, D) tokens, ``mask`` and ``ids_restore``."""
        self.check_mask_ratio(mask_ratio)  # the public entry: checked here, not again below
        x = self.embed_patches(imgs)
        if noise is None:
            noise = sample_noise(self.mask_strategy, x.shape[0], self.grid_size, mask_ratio, x.device)
        x, mask, ids_restore = random_masking(x, mask_ratio, noise)
        return self.prepend_cls_token(x), mask, ids_restore

    def embed_patches(self, imgs: torch.Tensor) -> torch.Tensor:
        """(N, C, H, W) -> (N, L, D) patch tokens plus their position embeddings, in patch order."""
        return self.patch_embed(imgs) + self.pos_embed[:, 1:, :]

    def prepend_cls_token(self, x: torch.Tensor) -> torch.Tensor:
        """(N, K, D) tokens -> (N, 1 + K, D), the cls token (plus its position embedding) first."""
        cls_token = self.cls_token + self.pos_embed[:, :1, :]
        return torch.cat([cls_token.expand(x.shape[0], -1, -1), x], dim=1)

    def forward_decoder(self, latent: torch.Tensor, ids_restore: torch.Tensor) -> torch.Tensor:
        """Reconstruct every patch from the visible latents plus one mask token per masked patch.

        Args:
            latent: (N, 1 + len_keep, D) from ``forward_encoder``.
            ids_restore: (N, L) from ``forward_encoder``.

        Returns:
            ``(N, L, D_target)`` predicted targets in patch order (pixels: D_target = p*p*C).
        """
        x = self.decoder_embed(latent)
        N, L = ids_restore.shape
        mask_tokens = self.mask_token.expand(N, L + 1 - x.shape[1], -1)
        x_ = torch.cat([x[:, 1:, :], mask_tokens], dim=1)  # shuffled order: visible first
        x_ = torch.gather(x_, 1, ids_restore.unsqueeze(-1).expand(-1, -1, x.shape[2]))
        x = torch.cat([x[:, :1, :], x_], dim=1)
        x = x + self.decoder_pos_embed

        x = self.run_blocks(self.decoder_blocks, x)
        x = self.decoder_norm(x)
        x = self.decoder_pred(x)
        return x[:, 1:, :]

    def forward_loss(self, imgs: torch.Tensor, pred: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        """MSE between ``pred`` (N, L, D_target) and the target of ``imgs``' patches, on masked patches
        only."""
        return masked_patch_mse(pred, self.target(imgs), mask)

    def forward(
        self,
        imgs: torch.Tensor,
        mask_ratio: float = 0.75,
        noise: torch.Tensor | None = None,
        decoder_noise: torch.Tensor | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Returns (loss, pred ``(N, L, D_target)``, mask (N, L) with 1 = masked). ``noise`` fixes the
        masks; ``decoder_noise`` is the decoder variants' (which masked patches partial reconstruction
        decodes): the paper's decoder reconstructs every masked patch and ignores it."""
        latent, mask, ids_restore = self.forward_encoder(imgs, mask_ratio, noise)
        pred = self.forward_decoder(latent, ids_restore)
        loss = self.forward_loss(imgs, pred, mask)
        return loss, pred, mask

    def check_decoded_patches(self, mask_ratio: float) -> None:
        """Raise ``ValueError`` when training at ``mask_ratio`` leaves the decoder nothing to reconstruct:
        never for the paper's decoder (a variant that reconstructs masked patches only overrides it)."""

    def forward_features(self, imgs: torch.Tensor) -> torch.Tensor:
        """Encoder on all patches, no masking: (N, C, H, W) -> (N, 1 + L, D), normed, patch order."""
        x = self.prepend_cls_token(self.embed_patches(imgs))
        return self.norm(self.run_blocks(self.blocks, x))


def _target_name(target: str | None, norm_pix_loss: bool | None) -> str:
    """The target named by ``target`` or by the official MAE's ``norm_pix_loss``.

    Raises:
        ConfigError: the two disagree.
    """
    if norm_pix_loss is None:
        return target or "pixel"
    implied = "norm_pix" if norm_pix_loss else "pixel"
    if target is not None and target != implied:
        raise ConfigError(
            f"norm_pix_loss={norm_pix_loss} means target {implied!r}, but target is {target!r}: "
            "give target alone (norm_pix_loss is its older name)"
        )
    return implied


def vit_blocks(
    dim: int, num_heads: int, depth: int, mlp_ratio: float, norm_layer: Callable[[int], nn.Module]
) -> nn.Sequential:
    """``depth`` timm ``Block``s of width ``dim`` with qkv bias, as timm's ``VisionTransformer`` builds
    them."""
    return nn.Sequential(
        *[
            Block(dim, num_heads, mlp_ratio=mlp_ratio, qkv_bias=True, norm_layer=norm_layer)
            for _ in range(depth)
        ]
    )


def init_linear_and_norm(m: nn.Module) -> None:
    """MAE's initialisation of one module (``nn.Module.apply``): Xavier-uniform linear weights, zero biases,
    unit LayerNorms."""
    if isinstance(m, nn.Linear):
        nn.init.xavier_uniform_(m.weight)
        if m.bias is not None:
            nn.init.zeros_(m.bias)
    elif isinstance(m, nn.LayerNorm):
        nn.init.ones_(m.weight)
        nn.init.zeros_(m.bias)
