"""The decoder variants: other papers' decoders on the MAE's encoder, subclasses of ``MaskedAutoencoderViT``.

``PartialReconstructionMAE`` (``decoder_keep_ratio`` < 1): in training the decoder gets the mask tokens
of a random fraction of the masked patches only, and the loss covers just those (Wang et al., VideoMAE
V2, 2023, decoder masking; Fu et al., CrossMAE, 2024, partial reconstruction).

``CrossMAE`` (``decoder_type="cross"``): mask-token queries cross-attend to the cls and visible tokens,
never to each other, optionally each decoder block to another encoder layer (``decoder_encoder_layers``);
any ``decoder_keep_ratio`` (Fu et al., "Rethinking Patch Dependence for Masked Autoencoders", 2024).

Both keep the paper's parameter names (their checkpoints load as the paper's do), and both reconstruct
every masked patch in evaluation mode, so validation losses and figures compare across variants.
``decoder_class`` picks the class for a set of switches; ``mae.models.factory`` builds with it.
"""

from collections.abc import Callable

import torch
from torch import nn

from mae.errors import ConfigError
from mae.models.cross_attention import CrossAttentionBlock
from mae.models.mae import MaskedAutoencoderViT
from mae.models.masking import check_decoded_patches, decoder_masking, num_decoded, num_kept


class PartialReconstructionMAE(MaskedAutoencoderViT):
    """The paper's self-attention decoder, reconstructing ``decoder_keep_ratio`` of the masked patches
    in training: the decoder's sequence is the cls and visible tokens plus only the chosen mask tokens."""

    @classmethod
    def implements(cls, decoder_type: str, decoder_keep_ratio: float) -> bool:
        return decoder_type == "self"

    @property
    def decodes_chosen_patches(self) -> bool:
        """Whether a training step decodes a chosen set of masked patches rather than the paper's sequence."""
        return self.decoder_keep_ratio < 1.0

    def forward(
        self,
        imgs: torch.Tensor,
        mask_ratio: float = 0.75,
        noise: torch.Tensor | None = None,
        decoder_noise: torch.Tensor | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Returns (loss, pred ``(N, L, D_target)``, mask (N, L) with 1 = masked). ``noise`` fixes the
        encoder's masks, ``decoder_noise`` the reconstructed subset (``decoded_patches``); the loss
        covers the reconstructed masked patches."""
        latent, mask, ids_restore = self.encode_for_decoder(imgs, mask_ratio, noise)
        ids_decode = self.decoded_patches(ids_restore, mask_ratio, decoder_noise)  # None: every masked patch
        pred = self.forward_decoder(latent, ids_restore, ids_decode)
        loss = self.forward_loss(imgs, pred, mask if ids_decode is None else _patch_mask(ids_decode, mask))
        return loss, pred, mask

    def encode_for_decoder(
        self, imgs: torch.Tensor, mask_ratio: float, noise: torch.Tensor | None = None
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """What the decoder reads, with ``mask`` and ``ids_restore``: here ``forward_encoder``'s output."""
        return self.forward_encoder(imgs, mask_ratio, noise)

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
            (N, M) patch indices (in training: ``decoder_keep_ratio`` of the masked patches), or None:
            every masked patch, as the paper (in evaluation mode always).
        """
        if not self.training or not self.decodes_chosen_patches:
            return None
        self.check_decoded_patches(mask_ratio)
        N, L = ids_restore.shape
        if decoder_noise is not None and decoder_noise.shape != (N, L):
            raise ConfigError(
                f"decoder_noise must have shape (N, L) = {(N, L)}, got {tuple(decoder_noise.shape)}"
            )
        len_keep = num_kept(L, mask_ratio)
        ids_masked = torch.argsort(ids_restore, dim=1)[:, len_keep:]  # the shuffle's masked part
        if self.decoder_keep_ratio == 1.0:
            return ids_masked
        return decoder_masking(ids_masked, num_decoded(L - len_keep, self.decoder_keep_ratio), decoder_noise)

    def check_decoded_patches(self, mask_ratio: float) -> None:
        """Raise ``ValueError`` when training at ``mask_ratio`` would leave the decoder no masked patch
        to reconstruct: ``decoder_keep_ratio`` rounding to none, or nothing masked at all."""
        if self.decodes_chosen_patches:
            check_decoded_patches(self.grid_size, mask_ratio, self.decoder_keep_ratio)

    def forward_decoder(
        self, latent: torch.Tensor, ids_restore: torch.Tensor, ids_decode: torch.Tensor | None = None
    ) -> torch.Tensor:
        """The paper's decoder when ``ids_decode`` is None; otherwise the self-attention decoder on the
        cls and visible tokens plus only the mask tokens of ``ids_decode`` (N, M), each with its position
        embedding (token order does not matter to attention). Returns ``(N, L, D_target)``, 0 for the
        masked patches left out."""
        if ids_decode is None:
            return super().forward_decoder(latent, ids_restore)
        x = self.decoder_embed(latent)
        N, L = ids_restore.shape
        ids_keep = torch.argsort(ids_restore, dim=1)[
            :, : x.shape[1] - 1
        ]  # patches of the visible tokens, as held
        ids = torch.cat([ids_keep, ids_decode], dim=1)
        tokens = torch.cat([x[:, 1:, :], self.mask_token.expand(N, ids_decode.shape[1], -1)], dim=1)
        tokens = tokens + self.decoder_positions(ids)
        x = torch.cat([x[:, :1, :] + self.decoder_pos_embed[:, :1, :], tokens], dim=1)
        x = self.decoder_pred(self.decoder_norm(self.run_blocks(self.decoder_blocks, x)))
        return _scatter_patches(x[:, 1:, :], ids, L)

    def decoder_positions(self, ids: torch.Tensor) -> torch.Tensor:
        """(N, K) patch indices -> (N, K, decoder width) their decoder position embeddings."""
        pos = self.decoder_pos_embed[:, 1:, :].expand(ids.shape[0], -1, -1)
        return torch.gather(pos, 1, ids.unsqueeze(-1).expand(-1, -1, pos.shape[-1]))


class CrossMAE(PartialReconstructionMAE):
    """CrossMAE's decoder: mask-token queries cross-attend to the cls and visible tokens, each block to its
    encoder layer's (``decoder_encoder_layers``) or to the encoder's output; queries never see each other.
    In training the queries are the masked patches (``decoder_keep_ratio`` of them); in evaluation every
    patch, visible ones too, so figures show a prediction everywhere."""

    @classmethod
    def implements(cls, decoder_type: str, decoder_keep_ratio: float) -> bool:
        return decoder_type == "cross"

    @property
    def decodes_chosen_patches(self) -> bool:
        return True  # the queries are the masked patches, never the paper's whole sequence

    def build_decoder_blocks(
        self, dim: int, num_heads: int, depth: int, mlp_ratio: float, norm_layer: Callable[[int], nn.Module]
    ) -> nn.Module:
        """Cross-attention blocks; each takes (queries, context), so a list, not a chain."""
        return nn.ModuleList(
            [CrossAttentionBlock(dim, num_heads, mlp_ratio, norm_layer) for _ in range(depth)]
        )

    def encode_for_decoder(
        self, imgs: torch.Tensor, mask_ratio: float, noise: torch.Tensor | None = None
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """``forward_encoder``'s output, or ``forward_encoder_layers``' with ``decoder_encoder_layers``."""
        if self.decoder_encoder_layers is None:
            return self.forward_encoder(imgs, mask_ratio, noise)
        return self.forward_encoder_layers(imgs, mask_ratio, noise)

    def forward_encoder_layers(
        self, imgs: torch.Tensor, mask_ratio: float, noise: torch.Tensor | None = None
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """The encoder on the visible patches, keeping the layers the decoder blocks read.

        Returns:
            layers: (decoder_depth, N, 1 + len_keep, D): for each decoder block, the output of the encoder
                block it reads, after the final norm (as timm's ``forward_intermediates(norm=True)``).
            mask, ids_restore: as ``forward_encoder``'s.
        """
        x, mask, ids_restore = self.visible_tokens(imgs, mask_ratio, noise)
        outputs = []
        for block in self.blocks:
            x = self.run_block(block, x)
            outputs.append(x)
        normed = {i: self.norm(outputs[i]) for i in sorted(set(self.decoder_encoder_layers))}
        return torch.stack([normed[i] for i in self.decoder_encoder_layers]), mask, ids_restore

    def forward_decoder(
        self, latent: torch.Tensor, ids_restore: torch.Tensor, ids_decode: torch.Tensor | None = None
    ) -> torch.Tensor:
        """Queries at the patches ``ids_decode`` (N, M) (None: every patch) read ``latent``:
        (N, 1 + len_keep, D) from ``forward_encoder``, or with ``decoder_encoder_layers`` the
        (decoder_depth, N, 1 + len_keep, D) stack of ``forward_encoder_layers``. Returns ``(N, L, D_target)``,
        0 for the patches not queried."""
        per_block = self.decoder_encoder_layers is not None
        if latent.dim() != (4 if per_block else 3):
            raise ValueError(
                "forward_decoder takes the output of "
                f"{'forward_encoder_layers' if per_block else 'forward_encoder'} here, got a tensor of shape "
                f"{tuple(latent.shape)}"
            )
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
            x = self.run_block(block, x, context[i] if per_block else context)
        x = self.decoder_pred(self.decoder_norm(x))
        return x if ids_decode is None else _scatter_patches(x, ids_decode, L)


def decoder_class(decoder_type: str, decoder_keep_ratio: float) -> type[MaskedAutoencoderViT]:
    """The class that implements these decoder switches; the paper's for values no class implements
    (its constructor then names what is wrong with them)."""
    for cls in (MaskedAutoencoderViT, PartialReconstructionMAE, CrossMAE):
        if cls.implements(decoder_type, decoder_keep_ratio):
            return cls
    return MaskedAutoencoderViT


def _patch_mask(ids: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
    """(N, L) mask, 1 at the patch indices ``ids`` (N, K), 0 elsewhere; dtype and device of ``like``."""
    return torch.zeros_like(like).scatter_(1, ids, 1.0)


def _scatter_patches(values: torch.Tensor, ids: torch.Tensor, num_patches: int) -> torch.Tensor:
    """(N, K, P) values of the patches ``ids`` (N, K) -> (N, L, P) in patch order, 0 elsewhere."""
    out = values.new_zeros(values.shape[0], num_patches, values.shape[-1])
    return out.scatter(1, ids.unsqueeze(-1).expand(-1, -1, values.shape[-1]), values)
