"""Reconstructions by a trained MAE: the model of a checkpoint with its input normalisation
(``load_reconstructor``), seeded masks (``mask_noise``), the four views (``reconstruct``: original | masked
input | reconstruction | reconstruction + visible patches), their picture (``reconstruction_grid``) and
an honest caption of what it shows (``caption_of``). Only a model whose decoder predicts pixels (target
``pixel`` or ``norm_pix``) has a reconstruction to draw (``check_pixel_target``)."""

import os
from typing import Literal

import torch
from torchvision.utils import make_grid

from mae.convert.backbone import load_mae
from mae.convert.sources import read_checkpoint
from mae.data import IMAGENET_MEAN, IMAGENET_STD
from mae.errors import ConfigError
from mae.inference.normalization import Normalization
from mae.models.loss import masked_patch_mse_per_image
from mae.models.mae import MaskedAutoencoderViT
from mae.models.masking import check_mask_ratio, check_visible_patches, sample_noise

Unnormalize = Literal["patch", "none"]


def load_reconstructor(
    checkpoint: str | os.PathLike,
    format: str = "auto",
    img_size: int | None = None,
    mean: list[float] | None = None,
    std: list[float] | None = None,
) -> tuple[MaskedAutoencoderViT, Normalization]:
    """The MAE (encoder and decoder) of ``checkpoint`` (any format ``mae.load_mae`` reads; at input size
    ``img_size`` when given, else the checkpoint's), in evaluation mode, and how its inputs are
    normalised: ``mean`` / ``std`` when given, else as the checkpoint records (``Normalization.of``)."""
    ckpt = read_checkpoint(checkpoint, format)
    model, _ = load_mae(ckpt, **({"img_size": img_size} if img_size else {}))
    check_pixel_target(model, str(checkpoint))
    in_chans = model.config["in_chans"]
    if mean:
        return model.eval(), Normalization(in_chans, tuple(mean), tuple(std))
    return model.eval(), Normalization.of(ckpt.data, in_chans, str(checkpoint))


def check_pixel_target(model: MaskedAutoencoderViT, source: str) -> None:
    """Stop where ``model`` (read from ``source``) predicts no pixels, so has no reconstruction to draw.

    Raises:
        ConfigError: naming ``source``, its target and why.
    """
    target = model.target
    if not target.pixels:
        raise ConfigError(
            f"{source} was pretrained with model.target {target.name}: its decoder predicts "
            f"{target.described} of each masked patch, not pixels, so there is no reconstruction to draw; "
            "reconstructions need a model pretrained with target pixel or norm_pix (its encoder serves "
            "features and fine-tuning as any other: mae.load_backbone)"
        )


def caption_of(model: MaskedAutoencoderViT, unnormalize: Unnormalize) -> str:
    """What the reconstruction panels show, honestly."""
    if model.target.name != "norm_pix":
        return "Pixel-target model: the reconstruction is its prediction as it is."
    if unnormalize == "patch":
        return (
            "norm_pix_loss model: it predicts each masked patch's normalised pattern only; the patches are "
            "drawn with the TRUE patches' mean and variance, which the model never saw, so the picture "
            "shows more than it knows (--unnormalize none: the raw prediction)."
        )
    return (
        "norm_pix_loss model, raw prediction: each masked patch's normalised pattern (zero mean, unit "
        "variance) drawn as a normalised image: what the model really predicts."
    )


def mask_noise(
    model: MaskedAutoencoderViT,
    count: int,
    mask_ratio: float,
    seed: int,
    same_mask: bool,
    strategy: str | None = None,
) -> torch.Tensor:
    """(count, L) masking scores drawn from ``seed`` with ``strategy`` ("random", "block", "grid";
    default: the model's): one mask repeated for every image with ``same_mask``.

    Raises:
        ValueError: a ratio the strategy cannot produce, or one that leaves no visible patch.
    """
    strategy = strategy or model.mask_strategy
    check_mask_ratio(mask_ratio, strategy)
    check_visible_patches(model.grid_size, mask_ratio)
    generator = torch.Generator().manual_seed(seed)
    noise = sample_noise(strategy, 1 if same_mask else count, model.grid_size, mask_ratio, "cpu", generator)
    return noise.expand(count, -1).contiguous()


@torch.no_grad()
def reconstruct(
    model: MaskedAutoencoderViT,
    imgs: torch.Tensor,
    mask_ratio: float = 0.75,
    noise: torch.Tensor | None = None,
    unnormalize: Unnormalize = "patch",
) -> dict[str, torch.Tensor]:
    """Run the model and return the four views, each (N, C, H, W) in the input's normalised space,
    and ``"loss"``, (N,) each image's masked-patch loss (the training loss of that image alone).

    With the ``norm_pix`` target the prediction is each patch's normalised pattern (zero mean, unit
    variance). ``unnormalize="patch"`` draws it with the mean and variance of the true patches,
    hidden ones included: that leaks each masked patch's brightness and contrast into the picture,
    so it shows more than the model knows. ``"none"`` draws the raw prediction as a normalised
    image: what the model really predicts. (The official demo does neither: its visualisation
    checkpoints were trained on raw pixels, and it shows their raw prediction.)
    """
    check_pixel_target(model, "the model")
    norm_pix = model.target.name == "norm_pix"
    _, pred, mask = model(imgs, mask_ratio, noise)
    pred, target = pred.float(), model.patchify(imgs.float())
    loss = masked_patch_mse_per_image(pred, target, mask, norm_pix)
    if norm_pix and unnormalize == "patch":
        pred = pred * (target.var(dim=-1, keepdim=True) + 1e-6) ** 0.5 + target.mean(dim=-1, keepdim=True)
    recon = model.unpatchify(pred)
    pixel_mask = model.unpatchify(mask.float().unsqueeze(-1).expand(-1, -1, pred.shape[-1]))  # 1 = masked
    imgs = imgs.float()
    return {
        "original": imgs,
        "masked": imgs * (1 - pixel_mask),
        "reconstruction": recon,
        "reconstruction_visible": imgs * (1 - pixel_mask) + recon * pixel_mask,
        "loss": loss,
    }


def denormalize(x: torch.Tensor, mean=IMAGENET_MEAN, std=IMAGENET_STD) -> torch.Tensor:
    """(N, C, H, W) normalised -> the data's own units (for 8/16-bit images: [0, 1])."""
    mean = torch.tensor(mean, device=x.device, dtype=x.dtype).view(1, -1, 1, 1)
    std = torch.tensor(std, device=x.device, dtype=x.dtype).view(1, -1, 1, 1)
    return x * std + mean


def to_display(
    x: torch.Tensor, bands: list[int] | None = None, value_range: tuple[float, float] = (0.0, 1.0)
) -> torch.Tensor:
    """(N, C, H, W) in data units -> (N, 3, H, W) in [0, 1] for a picture: one channel as gray, two as
    (first, second, second), three as RGB, more through three chosen ``bands`` (default: the first
    three); ``value_range`` (low, high) maps to black and white."""
    channels = x.shape[1]
    if bands is not None:
        if len(bands) != 3 or not all(0 <= b < channels for b in bands):
            raise ConfigError(
                f"reconstruction.bands must be 3 channel indices in [0, {channels}), got {bands}"
            )
        x = x[:, list(bands)]
    elif channels == 1:
        x = x.expand(-1, 3, -1, -1)
    elif channels == 2:
        x = x[:, [0, 1, 1]]
    elif channels != 3:
        x = x[:, :3]  # the first three bands, unless told otherwise
    low, high = value_range
    return ((x - low) / max(high - low, 1e-12)).clamp(0, 1)


def reconstruction_grid(
    views: dict[str, torch.Tensor],
    mean: tuple[float, ...] = IMAGENET_MEAN,
    std: tuple[float, ...] = IMAGENET_STD,
    bands: list[int] | None = None,
    value_range: tuple[float, float] | None = (0.0, 1.0),
) -> torch.Tensor:
    """(3, H', W') image in [0, 1]: one row per sample, the four views left to right, un-normalised
    with the data's ``mean`` / ``std``. ``value_range``: the data values shown black and white (None:
    the originals' minimum and maximum, for float data in its own units)."""
    order = ("original", "masked", "reconstruction", "reconstruction_visible")
    data = {k: denormalize(views[k].float(), mean, std) for k in order}
    if value_range is None:
        value_range = (data["original"].min().item(), data["original"].max().item())
    columns = [to_display(data[k], bands, value_range) for k in order]
    rows = torch.stack(columns, dim=1).flatten(0, 1)  # (N*4, 3, H, W), sample-major
    return make_grid(rows.cpu(), nrow=4, padding=2, pad_value=1.0)
