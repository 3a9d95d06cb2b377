"""The pooled embedding of an encoder's tokens, one definition for every use: kNN and the linear probe
(``mae.eval``), ``mae embed`` and the encoder's ONNX file (``mae.convert.onnx_encoder``)."""

from collections.abc import Callable
from typing import Literal, get_args

import torch

from mae.errors import ConfigError

Pool = Literal["cls", "avg", "both"]
POOLS: tuple[str, ...] = get_args(Pool)


def pooled(model: torch.nn.Module, pool: Pool) -> Callable[[torch.Tensor], torch.Tensor]:
    """(N, C, H, W) -> (N, D) float (or (N, 2D) for "both"): the normed cls token, the mean of the
    normed patch tokens, or both side by side; for an MAE model or a timm ViT, on all patches."""
    if pool not in POOLS:
        raise ConfigError(f"probe.pool must be 'cls', 'avg' or 'both', got {pool!r}")

    def encode(imgs: torch.Tensor) -> torch.Tensor:
        tokens = model.forward_features(imgs)
        if pool == "cls":
            return tokens[:, 0].float()
        patches = tokens[:, 1:].mean(1)
        return (patches if pool == "avg" else torch.cat([tokens[:, 0], patches], dim=1)).float()

    return encode
