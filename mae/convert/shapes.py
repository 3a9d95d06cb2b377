"""What a state dict's tensor shapes say about the model that holds it: ``infer_config`` reads the
``MaskedAutoencoderViT`` arguments off them, with hints for what shapes cannot tell (heads, image size)."""

import math
from pathlib import Path
from typing import Any

import torch

from mae.convert.report import block_count
from mae.errors import InputError
from mae.models.targets import target_of

# Standard ViT widths -> heads (64-d heads, except ViT-H: 16 heads of 80).
_HEADS_BY_WIDTH = {192: 3, 384: 6, 768: 12, 1024: 16, 1280: 16}


def infer_config(
    state: dict[str, torch.Tensor], hints: dict[str, Any] | None = None, source: str | Path = "the state dict"
) -> tuple[dict, list[str]]:
    """``MaskedAutoencoderViT`` arguments from tensor shapes, with ``hints`` for what shapes cannot tell;
    ``source`` names the file in errors.

    Returns:
        (config, notes): notes say what was assumed (heads from the width, a square image).

    Raises:
        InputError: no patch embedding or position embedding (not a ViT), or a position grid that is
            not square when no ``img_size`` hint says the shape.
    """
    hints = dict(hints or {})
    notes: list[str] = []
    embed_dim, in_chans, patch_size = _patch_embedding(state, source)
    depth = block_count(state, "blocks")
    img_size = _image_size(state, hints.get("img_size"), patch_size, notes, source)
    num_heads = hints.get("num_heads")
    if num_heads is None:
        num_heads = _HEADS_BY_WIDTH.get(embed_dim, max(1, embed_dim // 64))
        notes.append(
            f"num_heads={num_heads} assumed from width {embed_dim} (the file does not say); pass num_heads="
        )
    config = dict(
        img_size=img_size,
        patch_size=patch_size,
        in_chans=in_chans,
        embed_dim=embed_dim,
        depth=depth,
        num_heads=num_heads,
        mlp_ratio=state["blocks.0.mlp.fc1.weight"].shape[0] / embed_dim if depth else 4.0,
        target=target_of(hints),
        mask_strategy="random",
        layer_norm_eps=hints.get("layer_norm_eps", 1e-6),
        decoder_embed_dim=512,
        decoder_depth=8,
        decoder_num_heads=16,
    )
    if "decoder_embed.weight" in state:
        config.update(_decoder_config(state, hints.get("decoder_num_heads"), notes))
    return config, notes


def _patch_embedding(state: dict[str, torch.Tensor], source: str | Path) -> tuple[int, int, int]:
    """(D, C, p) of the patch embedding's (D, C, p, p) conv weight."""
    if "patch_embed.proj.weight" not in state or "pos_embed" not in state:
        raise InputError(
            f"{source} is not a ViT / MAE state dict: no patch_embed.proj.weight or pos_embed (keys start "
            f"{sorted(state)[:5]}); a CNN's bare state dict does not name its timm model: give its timm "
            "folder or our export of it, or start a CNN model from it with model.init_from"
        )
    proj = state["patch_embed.proj.weight"]
    if proj.ndim != 4:
        raise InputError(
            f"{source}: patch_embed.proj.weight must be a conv weight (D, C, p, p), got shape "
            f"{tuple(proj.shape)}"
        )
    return proj.shape[0], proj.shape[1], proj.shape[-1]


def _image_size(
    state: dict[str, torch.Tensor], hint: Any, patch_size: int, notes: list[str], source: str | Path
) -> tuple[int, int]:
    """(H, W) pixels: the hint, else the square position grid times the patch size (noted)."""
    if hint is None:
        num_patches = state["pos_embed"].shape[1] - 1
        side = math.isqrt(num_patches)
        if side * side != num_patches:
            raise InputError(
                f"{source}: pos_embed has {num_patches} patch positions, not a square grid: pass "
                "img_size=(H, W)"
            )
        hint = side * patch_size
        notes.append(f"img_size={hint} from the {side}x{side} position grid")
    return tuple(hint) if isinstance(hint, (list, tuple)) else (hint, hint)


def _decoder_config(state: dict[str, torch.Tensor], heads: int | None, notes: list[str]) -> dict[str, Any]:
    """The decoder's arguments: its kind, width, depth and heads (assumed from the width when not given)."""
    width = state["decoder_embed.weight"].shape[0]
    if heads is None:
        heads = 16 if width == 512 else max(1, width // 32)
        notes.append(f"decoder_num_heads={heads} assumed from decoder width {width}")
    return dict(
        # A cross-attention decoder's blocks have query and key-value projections
        # (mae.models.cross_attention).
        decoder_type="cross" if "decoder_blocks.0.attn.kv.weight" in state else "self",
        decoder_embed_dim=width,
        decoder_depth=block_count(state, "decoder_blocks"),
        decoder_num_heads=heads,
    )
