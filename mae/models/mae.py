"""The masked autoencoder: a ViT encoder on the visible patches, a light decoder with mask tokens.

Parameter names and layout are those of the official MAE model (``models_mae.py``), so its
checkpoints load with ``strict=True``; the encoder's names are timm ``VisionTransformer``'s.

Two switches change the decoder, both off by default (the paper's exact path):
``decoder_keep_ratio`` < 1 reconstructs a random subset of the masked patches in training (partial
reconstruction), ``decoder_type="cross"`` makes mask-token queries cross-attend to the visible tokens
instead of self-attending with them (CrossMAE), optionally each decoder block to another encoder layer.

References: He et al., "Masked Autoencoders Are Scalable Vision Learners" (2021); partial reconstruction:
Wang et al., VideoMAE V2 (2023, decoder masking) and Fu et al., "Rethinking Patch Dependence for Masked
Autoencoders" (CrossMAE, 2024), which also gives the cross-attention decoder.
"""

from functools import partial

import torch
from timm.layers import PatchEmbed, to_2tuple
from timm.models.vision_transformer import Block
from torch import nn

from mae.errors import ConfigError
from mae.models.cross_attention import CrossAttentionBlock
from mae.models.decoder_switches import DecoderType, check_decoder_encoder_layers, check_decoder_type
from mae.models.loss import masked_patch_mse
from mae.models.masking import (
    MaskStrategy,
    check_decoded_patches,
    check_decoder_keep_ratio,
    check_mask_ratio,
    check_mask_strategy,
    check_visible_patches,
    decoder_masking,
    num_decoded,
    num_kept,
    random_masking,
    sample_noise,
)
from mae.models.patch_grid import check_img_size
from mae.models.pos_embed import sincos_2d


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
        norm_pix_loss: regress per-patch normalised pixels (the paper's released models do).
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
        norm_pix_loss: bool = False,
        mask_strategy: MaskStrategy = "random",
        layer_norm_eps: float = 1e-6,
        decoder_type: DecoderType = "self",
        decoder_keep_ratio: float = 1.0,
        decoder_encoder_layers: list[int] | None = None,
    ) -> None:
        super().__init__()
        img_size = to_2tuple(img_size)
        # Constructor arguments, so checkpoints and exports can rebuild this exact architecture.
        self.config = dict(
            img_size=tuple(img_size), patch_size=patch_size, in_chans=in_chans, embed_dim=embed_dim, depth=depth,
            num_heads=num_heads, decoder_embed_dim=decoder_embed_dim, decoder_depth=decoder_depth,
            decoder_num_heads=decoder_num_heads, mlp_ratio=mlp_ratio, norm_pix_loss=norm_pix_loss,
            mask_strategy=mask_strategy, layer_norm_eps=layer_norm_eps, decoder_type=decoder_type,
            decoder_keep_ratio=decoder_keep_ratio, decoder_encoder_layers=decoder_encoder_layers,
        )  # fmt: skip
        check_img_size(img_size, patch_size)
        for name, dim, heads in (("", embed_dim, num_heads), ("decoder_", decoder_embed_dim, decoder_num_heads)):
            if dim % heads:
                raise ConfigError(f"{name}embed_dim {dim} is not divisible by {name}num_heads {heads}")
            if dim % 4:
                raise ConfigError(f"{name}embed_dim {dim} must be divisible by 4 for 2-D sin-cos position embeddings")
        check_mask_strategy(mask_strategy, "mask_strategy")
        check_decoder_type(decoder_type, "decoder_type")
        check_decoder_keep_ratio(decoder_keep_ratio, "decoder_keep_ratio")
        layers = check_decoder_encoder_layers(decoder_type, decoder_encoder_layers, depth, decoder_depth)
        self.config["decoder_encoder_layers"] = self.decoder_encoder_layers = layers  # a list, counted from 0
        self.norm_pix_loss = norm_pix_loss
        self.mask_strategy = mask_strategy
        self.decoder_type = decoder_type
        self.decoder_keep_ratio = decoder_keep_ratio
        norm_layer = partial(nn.LayerNorm, eps=layer_norm_eps)
        block = partial(Block, mlp_ratio=mlp_ratio, qkv_bias=True, norm_layer=norm_layer)

        # Encoder: exactly timm VisionTransformer's parts and names.
        self.patch_embed = PatchEmbed(img_size, patch_size, in_chans, embed_dim)
        grid_size = self.patch_embed.grid_size
        self._check_grid(grid_size)
        self.cls_token = nn.Parameter(torch.zeros(1, 1, embed_dim))
        # Fixed sin-cos position embeddings: buffers, so no optimizer ever sees them.
        self.register_buffer("pos_embed", sincos_2d(embed_dim, grid_size).unsqueeze(0))
        self.blocks = nn.Sequential(*[block(embed_dim, num_heads) for _ in range(depth)])
        self.norm = norm_layer(embed_dim)

        # Decoder
        self.decoder_embed = nn.Linear(embed_dim, decoder_embed_dim)
        self.mask_token = nn.Parameter(torch.zeros(1, 1, decoder_embed_dim))
        self.register_buffer("decoder_pos_embed", sincos_2d(decoder_embed_dim, grid_size).unsqueeze(0))
        if decoder_type == "self":
            self.decoder_blocks = nn.Sequential(
                *[block(decoder_embed_dim, decoder_num_heads) for _ in range(decoder_depth)]
            )
        else:  # blocks take (queries, context): a list, not a chain
            self.decoder_blocks = nn.ModuleList(
                [CrossAttentionBlock(decoder_embed_dim, decoder_num_heads, mlp_ratio, norm_layer)
                 for _ in range(decoder_depth)]
            )  # fmt: skip
        self.decoder_norm = norm_layer(decoder_embed_dim)
        self.decoder_pred = nn.Linear(decoder_embed_dim, patch_size**2 * in_chans)

        self.initialize_weights()

    def _check_grid(self, grid_size: tuple[int, int]) -> None:
        if self.mask_strategy == "grid" and (grid_size[0] % 2 or grid_size[1] % 2):
            raise ConfigError(f"grid masking needs an even patch grid, got {grid_size[0]}x{grid_size[1]}")

    def set_img_size(self, img_size: int | tuple[int, int]) -> None:
        """Take inputs of ``img_size`` from now on (same patch size): the patch grid and both fixed sin-cos
        position embeddings are those of a model built at that size (recomputed, not interpolated); every
        learned weight stays. ``config["img_size"]`` (what checkpoints record) is left as built."""
        img_size = check_img_size(img_size, self.patch_size)
        grid_size = (img_size[0] // self.patch_size, img_size[1] // self.patch_size)
        self._check_grid(grid_size)
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
        self.apply(_init_linear_and_norm)

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
        N, C, H, W = imgs.shape
        p = self.patch_size
        h, w = H // p, W // p
        x = imgs.reshape(N, C, h, p, w, p)
        x = torch.einsum("nchpwq->nhwpqc", x)
        return x.reshape(N, h * w, p * p * C)

    def unpatchify(self, x: torch.Tensor) -> torch.Tensor:
        """``(N, L, p*p*C)`` patches -> (N, C, H, W) images; inverse of ``patchify``."""
        N = x.shape[0]
        p = self.patch_size
        h, w = self.grid_size
        C = x.shape[-1] // (p * p)
        x = x.reshape(N, h, w, p, p, C)
        x = torch.einsum("nhwpqc->nchpwq", x)
        return x.reshape(N, C, h * p, w * p)

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
            latent: (N, 1 + len_keep, D), cls token first, ``len_keep = int(L * (1 - mask_ratio))``;
                (decoder_depth, N, 1 + len_keep, D) when ``decoder_encoder_layers`` is set
                (``forward_encoder_layers``).
            mask: (N, L), 0 = visible, 1 = masked.
            ids_restore: (N, L) permutation that puts the shuffled tokens back in patch order.
        """
        self.check_mask_ratio(mask_ratio)  # the public entry: checked here, not again below
        x = self.patch_embed(imgs)
        x = x + self.pos_embed[:, 1:, :]
        if noise is None:
            noise = sample_noise(self.mask_strategy, x.shape[0], self.grid_size, mask_ratio, x.device)
        x, mask, ids_restore = random_masking(x, mask_ratio, noise)

        cls_token = self.cls_token + self.pos_embed[:, :1, :]
        x = torch.cat([cls_token.expand(x.shape[0], -1, -1), x], dim=1)
        if self.decoder_encoder_layers is not None:  # the cross decoder's blocks read several layers
            return self.forward_encoder_layers(x), mask, ids_restore
        x = self.blocks(x)
        x = self.norm(x)
        return x, mask, ids_restore

    def forward_encoder_layers(self, x: torch.Tensor) -> torch.Tensor:
        """Encoder blocks on (N, 1 + len_keep, D) tokens -> (decoder_depth, N, 1 + len_keep, D): for each
        decoder block, the output of the encoder block it reads, after the final norm (as timm's
        ``forward_intermediates(norm=True)``)."""
        outputs = []
        for block in self.blocks:
            x = block(x)
            outputs.append(x)
        normed = {i: self.norm(outputs[i]) for i in sorted(set(self.decoder_encoder_layers))}
        return torch.stack([normed[i] for i in self.decoder_encoder_layers])

    def decoded_patches(
        self, ids_restore: torch.Tensor, mask_ratio: float, decoder_noise: torch.Tensor | None = None
    ) -> torch.Tensor | None:
        """Which masked patches the decoder reconstructs in this forward pass.

        Args:
            ids_restore: (N, L) from ``forward_encoder``.
            mask_ratio: the ratio the encoder masked at.
            decoder_noise: (N, L) per-patch scores for partial reconstruction (small = reconstructed);
                uniform random when None. Drawn only when ``decoder_keep_ratio`` < 1, in training.

        Returns:
            (N, M) patch indices (training with partial reconstruction: ``decoder_keep_ratio`` of the
            masked patches; training the cross decoder: every masked patch), or None: every masked
            patch, the paper's decoder (and in evaluation mode always).
        """
        if not self.training or (self.decoder_type == "self" and self.decoder_keep_ratio == 1.0):
            return None
        self.check_decoded_patches(mask_ratio)
        N, L = ids_restore.shape
        if decoder_noise is not None and decoder_noise.shape != (N, L):
            raise ConfigError(f"decoder_noise must have shape (N, L) = {(N, L)}, got {tuple(decoder_noise.shape)}")
        len_keep = num_kept(L, mask_ratio)
        ids_masked = torch.argsort(ids_restore, dim=1)[:, len_keep:]  # the shuffle's masked part
        if self.decoder_keep_ratio == 1.0:
            return ids_masked
        return decoder_masking(ids_masked, num_decoded(L - len_keep, self.decoder_keep_ratio), decoder_noise)

    def check_decoded_patches(self, mask_ratio: float) -> None:
        """Raise ``ValueError`` when training at ``mask_ratio`` would leave the decoder no masked patch
        to reconstruct: ``decoder_keep_ratio`` rounding to none, or nothing masked at all (partial
        reconstruction and the cross decoder reconstruct masked patches only)."""
        if self.decoder_type == "cross" or self.decoder_keep_ratio < 1.0:
            check_decoded_patches(self.grid_size, mask_ratio, self.decoder_keep_ratio)

    def forward_decoder(
        self, latent: torch.Tensor, ids_restore: torch.Tensor, ids_decode: torch.Tensor | None = None
    ) -> torch.Tensor:
        """Reconstruct the patches from the visible latents plus mask tokens.

        Args:
            latent: (N, 1 + len_keep, D) encoder output (or its per-block stack, ``forward_encoder``).
            ids_restore: (N, L) from ``forward_encoder``.
            ids_decode: (N, M) the masked patches whose mask tokens enter the decoder
                (``decoded_patches``); None = the paper: every masked patch (the cross decoder then
                queries every patch, visible ones too, so figures show a prediction everywhere).

        Returns:
            ``(N, L, p*p*C)`` predicted pixels in patch order; 0 for masked patches outside ``ids_decode``.
        """
        if self.decoder_type == "cross":
            return self.forward_cross_decoder(latent, ids_restore, ids_decode)
        if ids_decode is not None:
            return self.forward_partial_decoder(latent, ids_restore, ids_decode)
        x = self.decoder_embed(latent)
        N, L = ids_restore.shape
        mask_tokens = self.mask_token.expand(N, L + 1 - x.shape[1], -1)
        x_ = torch.cat([x[:, 1:, :], mask_tokens], dim=1)  # shuffled order: visible first
        x_ = torch.gather(x_, 1, ids_restore.unsqueeze(-1).expand(-1, -1, x.shape[2]))
        x = torch.cat([x[:, :1, :], x_], dim=1)
        x = x + self.decoder_pos_embed

        x = self.decoder_blocks(x)
        x = self.decoder_norm(x)
        x = self.decoder_pred(x)
        return x[:, 1:, :]

    def forward_partial_decoder(
        self, latent: torch.Tensor, ids_restore: torch.Tensor, ids_decode: torch.Tensor
    ) -> torch.Tensor:
        """The self-attention decoder on the cls and visible tokens plus only the mask tokens of
        ``ids_decode`` (N, M), each with its position embedding (token order does not matter to
        attention): ``(N, L, p*p*C)``, 0 for the masked patches left out."""
        x = self.decoder_embed(latent)
        N, L = ids_restore.shape
        ids_keep = torch.argsort(ids_restore, dim=1)[:, : x.shape[1] - 1]  # patches of the visible tokens, as held
        ids = torch.cat([ids_keep, ids_decode], dim=1)
        tokens = torch.cat([x[:, 1:, :], self.mask_token.expand(N, ids_decode.shape[1], -1)], dim=1)
        tokens = tokens + self.decoder_positions(ids)
        x = torch.cat([x[:, :1, :] + self.decoder_pos_embed[:, :1, :], tokens], dim=1)
        x = self.decoder_pred(self.decoder_norm(self.decoder_blocks(x)))
        return _scatter_patches(x[:, 1:, :], ids, L)

    def forward_cross_decoder(
        self, latent: torch.Tensor, ids_restore: torch.Tensor, ids_decode: torch.Tensor | None = None
    ) -> torch.Tensor:
        """CrossMAE's decoder: mask-token queries at the patches ``ids_decode`` (N, M) (None: every
        patch) cross-attend to the cls and visible tokens, each block to its encoder layer's; queries
        never see each other. Returns ``(N, L, p*p*C)``, 0 for the patches not queried."""
        N, L = ids_restore.shape
        context = self.decoder_embed(latent)
        ids_keep = torch.argsort(ids_restore, dim=1)[:, : context.shape[-2] - 1]
        cls_pos = self.decoder_pos_embed[:, :1, :].expand(N, -1, -1)
        context = context + torch.cat([cls_pos, self.decoder_positions(ids_keep)], dim=1)
        if ids_decode is None:
            x = (self.mask_token + self.decoder_pos_embed[:, 1:, :]).expand(N, -1, -1)
        else:
            x = self.mask_token + self.decoder_positions(ids_decode)
        for i, block in enumerate(self.decoder_blocks):
            x = block(x, context if self.decoder_encoder_layers is None else context[i])
        x = self.decoder_pred(self.decoder_norm(x))
        return x if ids_decode is None else _scatter_patches(x, ids_decode, L)

    def decoder_positions(self, ids: torch.Tensor) -> torch.Tensor:
        """(N, K) patch indices -> (N, K, decoder width) their decoder position embeddings."""
        pos = self.decoder_pos_embed[:, 1:, :].expand(ids.shape[0], -1, -1)
        return torch.gather(pos, 1, ids.unsqueeze(-1).expand(-1, -1, pos.shape[-1]))

    def forward_loss(self, imgs: torch.Tensor, pred: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        """MSE between ``pred`` (N, L, p*p*C) and the patches of ``imgs``, on masked patches only."""
        return masked_patch_mse(pred, self.patchify(imgs), mask, self.norm_pix_loss)

    def forward(
        self,
        imgs: torch.Tensor,
        mask_ratio: float = 0.75,
        noise: torch.Tensor | None = None,
        decoder_noise: torch.Tensor | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Returns (loss, pred ``(N, L, p*p*C)``, mask (N, L) with 1 = masked). ``noise`` fixes the
        encoder's masks, ``decoder_noise`` the reconstructed subset (``decoded_patches``); the loss
        covers the reconstructed masked patches: all of them unless ``decoder_keep_ratio`` < 1."""
        latent, mask, ids_restore = self.forward_encoder(imgs, mask_ratio, noise)
        ids_decode = self.decoded_patches(ids_restore, mask_ratio, decoder_noise)  # None: every masked patch
        pred = self.forward_decoder(latent, ids_restore, ids_decode)
        loss = self.forward_loss(imgs, pred, mask if ids_decode is None else _patch_mask(ids_decode, mask))
        return loss, pred, mask

    def forward_features(self, imgs: torch.Tensor) -> torch.Tensor:
        """Encoder on all patches, no masking: (N, C, H, W) -> (N, 1 + L, D), normed, patch order."""
        x = self.patch_embed(imgs) + self.pos_embed[:, 1:, :]
        cls_token = self.cls_token + self.pos_embed[:, :1, :]
        x = torch.cat([cls_token.expand(x.shape[0], -1, -1), x], dim=1)
        return self.norm(self.blocks(x))


def _patch_mask(ids: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
    """(N, L) mask, 1 at the patch indices ``ids`` (N, K), 0 elsewhere; dtype and device of ``like``."""
    return torch.zeros_like(like).scatter_(1, ids, 1.0)


def _scatter_patches(values: torch.Tensor, ids: torch.Tensor, num_patches: int) -> torch.Tensor:
    """(N, K, P) values of the patches ``ids`` (N, K) -> (N, L, P) in patch order, 0 elsewhere."""
    out = values.new_zeros(values.shape[0], num_patches, values.shape[-1])
    return out.scatter(1, ids.unsqueeze(-1).expand(-1, -1, values.shape[-1]), values)


def _init_linear_and_norm(m: nn.Module) -> None:
    if isinstance(m, nn.Linear):
        nn.init.xavier_uniform_(m.weight)
        if m.bias is not None:
            nn.init.zeros_(m.bias)
    elif isinstance(m, nn.LayerNorm):
        nn.init.ones_(m.weight)
        nn.init.zeros_(m.bias)
