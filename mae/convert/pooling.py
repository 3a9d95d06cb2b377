"""The pooled embedding of an encoder's output, one definition for every use: kNN and the linear probe
(``mae.eval``), ``mae embed`` and the encoder's ONNX file (``mae.convert.onnx_encoder``).

A ViT (an MAE model or a timm ViT) gives tokens, cls first, and pools "cls", "avg" or "both". A CNN (a timm
ResNet or ConvNeXt, or a ``MaskedAutoencoderCNN``) gives (N, C, h, w) maps and pools "avg" alone: timm's
own pooling (``forward_head(x, pre_logits=True)``: the spatial mean, and ConvNeXt's head norm after it).
"""

from collections.abc import Callable
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


def pooled(model: torch.nn.Module, pool: Pool) -> Callable[[torch.Tensor], torch.Tensor]:
    """(N, C, H, W) -> (N, D) float (or (N, 2D) for "both"): for a ViT (an MAE model or a timm ViT, on
    all patches) the normed cls token, the mean of the normed patch tokens, or both side by side; for a CNN
    ("avg" only) its last map pooled as timm pools it before its classifier.

    Raises:
        ConfigError: an unknown pool; "cls" or "both" for a CNN (it has no cls token).
    """
    check_pool(pool)
    if encoder_family(model) == "cnn":
        return _pooled_maps(model, pool)

    def encode(imgs: torch.Tensor) -> torch.Tensor:
        tokens = model.forward_features(imgs)
        if pool == "cls":
            return tokens[:, 0].float()
        patches = tokens[:, 1:].mean(1)
        return (patches if pool == "avg" else torch.cat([tokens[:, 0], patches], dim=1)).float()

    return encode


def _pooled_maps(model: torch.nn.Module, pool: Pool) -> Callable[[torch.Tensor], torch.Tensor]:
    """A CNN's "avg" embedding: ``forward_head(forward_features(x), pre_logits=True)`` of the timm model (a
    ``MaskedAutoencoderCNN``'s encoder: the dense timm model outside the MAE's own forward), else the
    spatial mean of the last map."""
    config = getattr(model, "config", None)  # a MaskedAutoencoderCNN's, naming its timm model
    cfg = getattr(model, "pretrained_cfg", None) or {}  # a timm model's
    name = (config or {}).get("encoder") if isinstance(config, dict) else cfg.get("architecture")
    name = name or type(model).__name__
    if pool != "avg":
        raise ConfigError(
            f"pool {pool!r} reads a cls token, and the CNN {name} has none (its features are (N, C, h, w) "
            "maps): use pool 'avg'"
        )
    network = model.encoder if isinstance(config, dict) and "encoder" in config else model  # the timm model
    head = getattr(network, "forward_head", None)

    def encode(imgs: torch.Tensor) -> torch.Tensor:
        maps = network.forward_features(imgs)
        maps = maps[-1] if isinstance(maps, list | tuple) else maps
        if head is not None:
            return head(maps, pre_logits=True).float()
        return maps.mean(dim=(2, 3)).float()

    return encode
