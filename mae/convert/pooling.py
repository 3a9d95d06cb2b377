"""The pooled embedding of an encoder's output, one definition for every use: kNN and the linear probe
(``mae.eval``), ``mae embed`` and the encoder's ONNX file (``mae.convert.onnx_encoder``).

A ViT (an MAE model or a timm ViT) gives tokens, cls first, and pools "cls", "avg" or "both". A CNN (a timm
ResNet or ConvNeXt, or a ``MaskedAutoencoderCNN``) gives (N, C, h, w) maps and pools "avg" alone: timm's
own pooling (``forward_head(x, pre_logits=True)``: the spatial mean, and ConvNeXt's head norm after it).

Features from any block (``blocks``, ``--feature-blocks``): a ViT's transformer blocks, a CNN's stages (timm's
``feature_info``). Each chosen block's output is pooled as the last block's is, and the pooled vectors are
**concatenated** in block order ((N, len(blocks) * D); a CNN's widths differ per stage). A ViT block's tokens
pass through the encoder's final norm first, as the last block's do (DINOv2's and timm's
``forward_intermediates(norm=True)``), so every block is read on the same scale; a CNN stage's map is
averaged over its positions (the last stage's through timm's head pooling, as without blocks). The default,
the last block alone, is the encoder's usual embedding, bit for bit.
"""

from collections.abc import Callable, Sequence
from typing import Literal, get_args

import torch

from mae.errors import ConfigError

Pool = Literal["cls", "avg", "both"]
POOLS: tuple[str, ...] = get_args(Pool)
# What each kind of encoder pools by default: a ViT its cls token (the paper's), a CNN the mean of its map.
DEFAULT_POOLS: dict[str, Pool] = {"vit": "cls", "cnn": "avg"}


def encoder_family(model: torch.nn.Module) -> str:
    """ "vit" for a network of patch tokens (it has a ``patch_embed``: an MAE model, a timm ViT), "cnn" for a
    convolutional one (a ``MaskedAutoencoderCNN``, a timm ResNet or ConvNeXt)."""
    family = getattr(model, "family", None)
    if family in DEFAULT_POOLS:
        return family
    return "vit" if hasattr(model, "patch_embed") else "cnn"


def default_pool(model: torch.nn.Module) -> Pool:
    """The pool ``model``'s features are read with when none is given: "cls" for a ViT, "avg" for a CNN."""
    return DEFAULT_POOLS[encoder_family(model)]


def check_pool(pool: str) -> None:
    """Raise ``ConfigError`` for a pool name outside ``POOLS``."""
    if pool not in POOLS:
        raise ConfigError(f"probe.pool must be 'cls', 'avg' or 'both', got {pool!r}")


def feature_depth(encoder: torch.nn.Module) -> int:
    """The blocks ``--feature-blocks`` counts: a ViT's transformer blocks, a CNN's stages (timm's
    ``feature_info``: a ResNet's 5 with its stem, a ConvNeXt's 4)."""
    blocks = getattr(encoder, "blocks", None)
    if blocks is not None:
        return len(blocks)
    return len(timm_cnn(encoder).feature_info)


def resolve_blocks(
    blocks: Sequence[int] | None, depth: int, max_blocks: int | None = None, option: str = "--feature-blocks"
) -> list[int]:
    """The encoder blocks whose outputs are the features, as indices in [0, depth), ascending: ``blocks``
    given as indices from the first block (0) or from the end (-1 the last); None: the last block.

    Raises:
        ConfigError: no block, more than ``max_blocks`` (None: no cap), a block outside the encoder's depth
            or one named twice, naming ``option``, the value and the depth.
    """
    if blocks is None:
        return [depth - 1]
    blocks = list(blocks)
    if not blocks or (max_blocks is not None and len(blocks) > max_blocks):
        most = f"1 to {max_blocks}" if max_blocks is not None else "1 or more"
        raise ConfigError(f"{option} takes {most} blocks, got {len(blocks)}: {blocks}")
    chosen = []
    for block in blocks:
        if isinstance(block, bool) or not isinstance(block, int) or not -depth <= block < depth:
            raise ConfigError(
                f"{option} {block!r} is not a block of this encoder of depth {depth}: give 0 to "
                f"{depth - 1}, or -1 (the last) to -{depth}"
            )
        chosen.append(block % depth)
    if len(set(chosen)) != len(chosen):
        raise ConfigError(f"{option} {blocks} names a block twice (depth {depth})")
    return sorted(chosen)


def stored_blocks(encoder: torch.nn.Module, blocks: Sequence[int] | None) -> list[int] | None:
    """``blocks`` as a record keeps them (an embedding index): the resolved indices, or None for the last
    block alone (the default, and what every record written before blocks could be chosen means)."""
    chosen = resolve_blocks(blocks, feature_depth(encoder))
    return None if chosen == [feature_depth(encoder) - 1] else chosen


def pooled_width(encoder: torch.nn.Module, pool: Pool, blocks: Sequence[int] | None = None) -> int:
    """D of ``pooled(encoder, pool, blocks)``'s vectors: a ViT's width per block (twice it for "both"), the
    sum of a CNN's chosen stages' widths (timm's ``feature_info``)."""
    chosen = resolve_blocks(blocks, feature_depth(encoder))
    if encoder_family(encoder) == "cnn":
        info = timm_cnn(encoder).feature_info
        return sum(info[i]["num_chs"] for i in chosen)
    width = getattr(encoder, "num_features", None) or encoder.config["embed_dim"]  # a timm ViT's, an MAE's
    return width * (2 if pool == "both" else 1) * len(chosen)


def blocks_read(encoder: torch.nn.Module, blocks: Sequence[int] | None) -> str:
    """How a command's line names the features it read: "block 4 of 4" (1-based, of the encoder's depth),
    "blocks 2+4 of 4 (concatenated)"; a CNN's "stage"."""
    depth = feature_depth(encoder)
    chosen = [b + 1 for b in resolve_blocks(blocks, depth)]
    kind = "stage" if encoder_family(encoder) == "cnn" else "block"
    if len(chosen) == 1:
        return f"{kind} {chosen[0]} of {depth}"
    return f"{kind}s {'+'.join(map(str, chosen))} of {depth} (concatenated)"


def pooled(
    model: torch.nn.Module, pool: Pool, blocks: Sequence[int] | None = None
) -> Callable[[torch.Tensor], torch.Tensor]:
    """(N, C, H, W) -> (N, D) float (or (N, 2D) for "both"): for a ViT (an MAE model or a timm ViT, on
    all patches) the normed cls token, the mean of the normed patch tokens, or both side by side; for a CNN
    ("avg" only) its last map pooled as timm pools it before its classifier. ``blocks`` (indices, negative
    from the end; None: the last) reads those blocks instead, each pooled so and concatenated in block
    order (the module's docstring): (N, len(blocks) * D).

    Raises:
        ConfigError: an unknown pool; "cls" or "both" for a CNN (it has no cls token); a block outside the
            encoder (``resolve_blocks``).
    """
    check_pool(pool)
    chosen = resolve_blocks(blocks, feature_depth(model))
    if encoder_family(model) == "cnn":
        return _pooled_maps(model, pool, chosen)

    def pool_tokens(tokens: torch.Tensor) -> torch.Tensor:
        if pool == "cls":
            return tokens[:, 0].float()
        patches = tokens[:, 1:].mean(1)
        return (patches if pool == "avg" else torch.cat([tokens[:, 0], patches], dim=1)).float()

    if chosen == [feature_depth(model) - 1]:
        return lambda imgs: pool_tokens(model.forward_features(imgs))
    return lambda imgs: torch.cat([pool_tokens(t) for t in block_tokens(model, imgs, chosen)], dim=1)


def block_tokens(model: torch.nn.Module, imgs: torch.Tensor, blocks: Sequence[int]) -> list[torch.Tensor]:
    """(N, C, H, W) -> the outputs of a ViT's ``blocks`` (indices in [0, depth), ascending), each
    (N, 1 + L, D) with the cls token first, through the encoder's final norm; an MAE model's or a timm
    ViT's encoder on all patches."""
    if hasattr(model, "forward_intermediates"):  # a timm ViT
        outputs = model.forward_intermediates(
            imgs,
            indices=list(blocks),
            norm=True,
            return_prefix_tokens=True,
            output_fmt="NLC",
            intermediates_only=True,
        )
        return [torch.cat([prefix, tokens], dim=1) for tokens, prefix in outputs]
    x = model.prepend_cls_token(model.embed_patches(imgs))  # an MaskedAutoencoderViT
    outputs = []
    for index, block in enumerate(model.blocks[: max(blocks) + 1]):
        x = block(x)
        if index in blocks:
            outputs.append(model.norm(x))
    return outputs


def timm_cnn(model: torch.nn.Module) -> torch.nn.Module:
    """The timm network of a CNN encoder: a ``MaskedAutoencoderCNN``'s ``encoder`` (the dense timm model
    outside the MAE's own forward), else the model itself."""
    config = getattr(model, "config", None)  # a MaskedAutoencoderCNN's, naming its timm model
    return model.encoder if isinstance(config, dict) and "encoder" in config else model


def _pooled_maps(
    model: torch.nn.Module, pool: Pool, blocks: list[int]
) -> Callable[[torch.Tensor], torch.Tensor]:
    """A CNN's "avg" embedding of its stages ``blocks``: the last stage's
    ``forward_head(map, pre_logits=True)`` of the timm model (else its spatial mean), an earlier stage's
    spatial mean, concatenated in stage order."""
    config = getattr(model, "config", None)
    cfg = getattr(model, "pretrained_cfg", None) or {}  # a timm model's
    name = (config or {}).get("encoder") if isinstance(config, dict) else cfg.get("architecture")
    name = name or type(model).__name__
    if pool != "avg":
        raise ConfigError(
            f"pool {pool!r} reads a cls token, and the CNN {name} has none (its features are (N, C, h, w) "
            "maps): use pool 'avg'"
        )
    network = timm_cnn(model)
    head = getattr(network, "forward_head", None)
    last = len(network.feature_info) - 1

    def pool_map(maps: torch.Tensor, stage: int) -> torch.Tensor:
        if stage == last and head is not None:
            return head(maps, pre_logits=True).float()
        return maps.mean(dim=(2, 3)).float()

    if blocks == [last]:

        def encode(imgs: torch.Tensor) -> torch.Tensor:
            maps = network.forward_features(imgs)
            return pool_map(maps[-1] if isinstance(maps, list | tuple) else maps, last)

        return encode

    def encode_blocks(imgs: torch.Tensor) -> torch.Tensor:
        maps = network.forward_intermediates(imgs, indices=blocks, intermediates_only=True)
        return torch.cat([pool_map(m, stage) for m, stage in zip(maps, blocks, strict=True)], dim=1)

    return encode_blocks
