"""An encoder that turns image files into embedding vectors: any checkpoint ``mae.load_backbone`` reads,
its images read and normalised as its training data was (``mae.inference.images``), pooled as every
evaluation pools (``mae.eval.features.pooled``), and a fingerprint of its weights, so that an index and
its queries can be checked to come from the same encoder."""

import hashlib
import os
from dataclasses import dataclass
from pathlib import Path

import timm
import torch
from timm.layers import to_2tuple

from mae.convert.backbone import load_backbone
from mae.convert.pooling import default_pool, pooled_width, stored_blocks
from mae.convert.sources import MAECheckpoint, read_checkpoint
from mae.data import DEFAULT_MAX_PIXELS
from mae.errors import ConfigError
from mae.eval.features import POOLS, Pool, pooled
from mae.inference.images import load_image
from mae.inference.normalization import Normalization


def weights_fingerprint(ckpt: MAECheckpoint, decoder: bool = False) -> str:
    """SHA-256 (hex) of the encoder's weights (``decoder``: the whole MAE's, decoder and mask token
    included): every tensor's name, dtype, shape and bytes, in name order.
    The same weights give the same fingerprint in every format the readers map to the official names (our
    checkpoint, its export, an official or Hugging Face file); a retrained ``last.ckpt`` gives another."""
    digest = hashlib.sha256()
    for name, tensor in sorted((ckpt.state_dict if decoder else ckpt.encoder_state_dict()).items()):
        tensor = tensor.detach().cpu().contiguous()
        digest.update(f"{name}|{tensor.dtype}|{tuple(tensor.shape)}\n".encode())
        digest.update(tensor.reshape(-1).view(torch.uint8).numpy().tobytes())
    return digest.hexdigest()


def vector_width(ckpt: MAECheckpoint, pool: Pool, blocks: list[int] | None = None) -> int:
    """D of the vectors ``ckpt``'s encoder gives pooled by ``pool`` from ``blocks`` (None: the last),
    read from its config without loading it: a ViT's ``embed_dim`` per block (twice it for "both"), a CNN's
    chosen stages' channels (its timm model built on the meta device)."""
    if "embed_dim" in ckpt.config:
        return ckpt.config["embed_dim"] * (2 if pool == "both" else 1) * len(blocks or [None])
    with torch.device("meta"):
        network = timm.create_model(ckpt.config["encoder"], pretrained=False, num_classes=0)
    return pooled_width(network, pool, blocks)


@dataclass
class Embedder:
    """A frozen encoder and how its inputs are made.

    Attributes:
        encoder: a timm ``VisionTransformer``, or a timm CNN (ResNet, ConvNeXt: a CNN checkpoint's), in
            evaluation mode on its device.
        norm: the normalisation of its inputs (``in_chans`` channels).
        pool: "cls", "avg" or "both" (``mae.eval.features.pooled``; a CNN: "avg", its last map's mean).
        img_size: (H, W) input size in pixels.
        checkpoint: the checkpoint's path, absolute.
        fingerprint: ``weights_fingerprint`` of the checkpoint.
        max_pixels: larger images are refused.
        blocks: the encoder blocks read (indices from 0, several concatenated: ``pooled``); None: the last.
    """

    encoder: torch.nn.Module
    norm: Normalization
    pool: Pool
    img_size: tuple[int, int]
    checkpoint: str
    fingerprint: str
    max_pixels: int | None = DEFAULT_MAX_PIXELS
    blocks: list[int] | None = None

    @property
    def dim(self) -> int:
        """The length of one vector: the encoder's width (timm's ``num_features``: a ViT's embed_dim, a
        CNN's last map's channels), twice it for "both", per block read (``pooled_width``)."""
        return pooled_width(self.encoder, self.pool, self.blocks)

    @property
    def device(self) -> torch.device:
        return next(self.encoder.parameters()).device

    def load(self, path: str | os.PathLike) -> torch.Tensor:
        """(C, H, W) normalised input of one image file (``mae.inference.images.load_image``).

        Raises:
            OSError, ValueError, PIL.Image.DecompressionBombError: naming the file.
        """
        return load_image(path, self.img_size, self.norm, self.max_pixels)

    @torch.no_grad()
    def __call__(self, imgs: torch.Tensor) -> torch.Tensor:
        """(N, C, H, W) normalised input -> (N, D) float32 vectors on the CPU."""
        return pooled(self.encoder, self.pool, self.blocks)(imgs.to(self.device)).cpu()


def load_embedder(
    checkpoint: str | os.PathLike | MAECheckpoint,
    pool: Pool | None = None,
    format: str = "auto",
    img_size: int | tuple[int, int] | None = None,
    norm: Normalization | None = None,
    device: str | torch.device = "cpu",
    max_pixels: int | None = DEFAULT_MAX_PIXELS,
    fingerprint: str | None = None,
    blocks: list[int] | None = None,
) -> Embedder:
    """The encoder of ``checkpoint`` (a path or a read checkpoint; at ``img_size``, default the
    checkpoint's) and its inputs' normalisation: ``norm`` when given, else the one the checkpoint records
    (``Normalization.of``). ``pool``: None pools as the encoder does by default (``default_pool``: the cls
    token of a ViT, the mean of a CNN's last map). ``fingerprint``: its ``weights_fingerprint`` when already
    computed. ``blocks``: the encoder blocks read (negative from the end; None: the last), kept resolved
    (``stored_blocks``: None for the last alone).

    Raises:
        FileNotFoundError, ValueError: an unreadable checkpoint, an unknown pool, or a file of another
            channel count than 3 that records no mean / std.
    """
    if pool is not None and pool not in POOLS:
        raise ConfigError(f"pool must be one of {', '.join(POOLS)}, got {pool!r}")
    ckpt = checkpoint if isinstance(checkpoint, MAECheckpoint) else read_checkpoint(checkpoint, format)
    in_chans = ckpt.config["in_chans"]
    norm = norm or Normalization.of(ckpt.data, in_chans, ckpt.source)
    if norm.in_chans != in_chans or len(norm.mean) != in_chans:
        raise ConfigError(
            f"{ckpt.source} reads {in_chans}-channel images but the mean / std given have "
            f"{len(norm.mean)} values: give one per channel"
        )
    encoder = load_backbone(ckpt, img_size=img_size).to(device).eval()
    if hasattr(encoder, "patch_embed"):  # a ViT: the size its position embeddings were resampled to
        size = tuple(encoder.patch_embed.img_size)
    else:  # a CNN takes any size: the one asked for, else the one it was trained at
        size = tuple(to_2tuple(img_size or encoder.load_report.config["img_size"]))
    pool = pool or default_pool(encoder)
    pooled(encoder, pool, blocks)  # a pool the encoder cannot give ("cls" of a CNN), a block it lacks: now
    return Embedder(
        encoder,
        norm,
        pool,
        size,
        str(Path(ckpt.source).absolute()),
        fingerprint or weights_fingerprint(ckpt),
        max_pixels,
        stored_blocks(encoder, blocks),
    )
