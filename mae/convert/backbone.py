"""Pretrained MAE weights from any supported source, as a timm ViT backbone or a full MAE model."""

import logging
from functools import partial
from pathlib import Path
from typing import Any

import torch
from timm.layers import resample_abs_pos_embed
from timm.models import adapt_input_conv
from timm.models.vision_transformer import VisionTransformer
from torch import nn

from mae.convert.checkpoint import MAECheckpoint, check_finite
from mae.convert.classifier import pooling_of
from mae.convert.families import MODEL_FAMILIES
from mae.convert.report import LoadReport, load_checked
from mae.convert.sources import read_checkpoint
from mae.convert.timm_args import vit_args
from mae.errors import ConfigError
from mae.models.decoder_switches import switch_differences
from mae.models.factory import MaskedAutoencoder, build_mae
from mae.models.mae import MaskedAutoencoderViT
from mae.models.patch_grid import check_img_size
from mae.models.targets import target_class, target_of

log = logging.getLogger(__name__)

# The decoder switches that change what the decoder's weights compute (not ``decoder_keep_ratio``,
# which only chooses how many patches a training step reconstructs).
_DECODER_ARCHITECTURE = ("decoder_type", "decoder_encoder_layers")
# A joint checkpoint's classifier (``mae.training.joint``), which an MAE read from it leaves aside.
_CLASSIFIER = ["fc_norm.*", "head.*"]


def build_vit(
    config: dict[str, Any],
    img_size: int | tuple[int, int] | None = None,
    global_pool: str = "token",
    num_classes: int = 0,
    **vit_kwargs: Any,
) -> VisionTransformer:
    """A freshly initialised timm ``VisionTransformer`` with the encoder architecture of an MAE ``config``."""
    args = vit_args(config)
    args["img_size"] = check_img_size(
        config["img_size"] if img_size is None else img_size, config["patch_size"]
    )
    return VisionTransformer(
        **args,
        global_pool=global_pool,
        num_classes=num_classes,
        norm_layer=partial(nn.LayerNorm, eps=config["layer_norm_eps"]),
        **vit_kwargs,
    )


def resample_pos_embed(pos_embed, new_grid: tuple[int, int], old_grid: tuple[int, int]):
    """(1, 1 + h*w, D) -> (1, 1 + H*W, D): bicubic on the patch positions, cls position kept, as the
    official MAE's interpolation (no antialiasing)."""
    if tuple(new_grid) == tuple(old_grid):
        return pos_embed
    return resample_abs_pos_embed(
        pos_embed,
        new_size=list(new_grid),
        old_size=list(old_grid),
        num_prefix_tokens=1,
        interpolation="bicubic",
        antialias=False,
    )


def adapt_patch_embed(
    state: dict[str, torch.Tensor],
    in_chans: int,
    report: LoadReport,
    key: str = "patch_embed.proj.weight",
    what: str = "patch embedding",
) -> dict[str, torch.Tensor]:
    """``state`` with ``key`` (the input convolution's weight: a ViT's patch embedding, a CNN's first
    convolution) adapted to ``in_chans`` input channels when the source has another count (timm's
    ``adapt_input_conv``: summed for 1 channel, repeated and scaled by source / target channels for more),
    noted in ``report``."""
    weight = state[key]
    if weight.shape[1] == in_chans:
        return state
    if weight.shape[1] == 3:  # every timm release adapts RGB weights
        adapted = adapt_input_conv(in_chans, weight)
    else:
        try:  # other source channel counts need timm's base_chans (recent releases)
            adapted = adapt_input_conv(in_chans, weight, base_chans=weight.shape[1])
        except TypeError:
            raise ConfigError(
                f"{report.source}: adapting its {weight.shape[1]}-channel {what} to {in_chans} "
                "channels needs a newer timm (adapt_input_conv with base_chans): pip install -U timm"
            ) from None
    state = {**state, key: adapted}
    how = "summed over the source's channels" if in_chans == 1 else "repeated and scaled"
    report.notes.append(f"{what} adapted from {weight.shape[1]} to {in_chans} input channels ({how})")
    return state


def load_backbone(
    source: str | Path | MAECheckpoint,
    img_size: int | tuple[int, int] | None = None,
    global_pool: str | None = None,
    num_classes: int = 0,
    format: str = "auto",
    num_heads: int | None = None,
    in_chans: int | None = None,
    **vit_kwargs: Any,
) -> VisionTransformer:
    """A timm ``VisionTransformer`` holding the pretrained encoder of ``source``. No masking, ever:
    every patch is encoded, in spatial (raster) order. For a CNN checkpoint, the timm CNN itself
    (``timm.create_model(encoder, num_classes=..., in_chans=...)``, ``global_pool`` "avg"; its weights
    loaded strictly: ``mae.convert.cnn_loading.cnn_backbone``).

    Args:
        source: checkpoint path (see ``mae.convert.sources`` for the formats) or a read checkpoint.
        img_size: input size; position embeddings are resampled when it changes the patch grid.
        global_pool: "token" (cls token, after the pretrained final norm) or "avg" (mean of patch
            tokens, then a new ``fc_norm``, the MAE fine-tuning choice); a CNN: "avg" (the default for it).
        num_classes: 0 for features only; otherwise a new (or, if the source has one of that size,
            loaded) linear head.
        format: "auto" or one of ``mae.convert.sources.FORMATS``.
        num_heads: override when the file does not say (see the load report's notes).
        in_chans: input channels when they differ from the source's; the patch embedding is adapted
            (``adapt_patch_embed``) and the report says so.
        **vit_kwargs: more ``VisionTransformer`` arguments (e.g. ``drop_path_rate``).

    Returns:
        The model; ``forward_features`` gives (N, 1 + L, D) tokens, ``forward_intermediates``
        per-block feature maps. The load report is logged and kept as ``model.load_report``.
    """
    ckpt = source if isinstance(source, MAECheckpoint) else read_checkpoint(source, format)
    return ckpt.model_family.backbone(
        ckpt, img_size, global_pool, num_classes, num_heads, in_chans, **vit_kwargs
    )


def vit_backbone(
    ckpt: MAECheckpoint,
    img_size: int | tuple[int, int] | None,
    global_pool: str,
    num_classes: int,
    num_heads: int | None,
    in_chans: int | None,
    **vit_kwargs: Any,
) -> VisionTransformer:
    """``load_backbone`` of a read ViT checkpoint (the ``vit`` row of ``MODEL_FAMILIES``); ``global_pool``
    None: "token"."""
    global_pool = global_pool or "token"
    _check_pooling(ckpt, global_pool)
    config = dict(ckpt.config)
    if num_heads is not None:
        config["num_heads"] = num_heads
    report = LoadReport(ckpt.source, ckpt.format, notes=list(ckpt.notes), config=config)
    state = ckpt.encoder_state_dict()
    check_finite(state, ckpt.source)
    if in_chans is not None:
        state = adapt_patch_embed(state, in_chans, report)
        config["in_chans"] = in_chans
    old_grid = tuple(s // config["patch_size"] for s in config["img_size"])
    model = build_vit(config, img_size, global_pool, num_classes, **vit_kwargs)
    new_grid = tuple(model.patch_embed.grid_size)
    state["pos_embed"] = resample_pos_embed(state["pos_embed"], new_grid, old_grid)

    if new_grid != old_grid:
        report.notes.append(f"position embeddings resampled from {old_grid} to {new_grid} patches (bicubic)")
    if "head.weight" in state and num_classes != state["head.weight"].shape[0]:
        state = {k: v for k, v in state.items() if not k.startswith("head.")}
        report.notes.append("the source's classification head has another number of classes: not loaded")
    load_checked(model, state, report, *_allowed_differences(global_pool))
    report.ignored += sorted(set(ckpt.state_dict) - set(ckpt.encoder_state_dict())) + ckpt.ignored  # decoder
    log.info("%s", report)
    model.load_report = report
    return model


def _check_pooling(ckpt: MAECheckpoint, global_pool: str) -> None:
    """Refuse token pooling of an encoder fine-tuned with average pooling (it has no final norm; a joint
    checkpoint's final norm, its MAE's, serves the cls token)."""
    no_final_norm = "norm.weight" not in ckpt.encoder_state_dict()
    if global_pool == "token" and pooling_of(ckpt) == "avg" and no_final_norm:
        raise ConfigError(
            f"{ckpt.source} is an encoder fine-tuned with global average pooling (an fc_norm, no final "
            "norm), so its cls token has no trained norm to pass through: load it with global_pool='avg' "
            "(the mean of the patch tokens through its fc_norm; --model.global_pool avg for mae finetune). "
            "Embedding, kNN / probe features and the ONNX export read the final norm: give them the "
            "pretraining checkpoint it came from"
        )


def _allowed_differences(global_pool: str) -> tuple[list[str], list[str]]:
    """(model tensors that may stay new, checkpoint tensors that may go unused) for ``global_pool``."""
    if global_pool == "avg":  # a new norm after pooling, as in MAE fine-tuning; no place for the final norm
        return ["head.*", "fc_norm.*"], ["head.*", "norm.*"]
    return ["head.*"], ["head.*", "fc_norm.*"]


def same_prediction(target: str, other: str) -> bool:
    """Whether decoders trained for the targets ``target`` and ``other`` predict the same kind of values:
    the same target, or pixels both (plain or normalised per patch, which the decoder of either starts
    from well)."""
    return target == other or (target_class(target).pixels and target_class(other).pixels)


def load_mae(
    source: str | Path | MAECheckpoint, format: str = "auto", **overrides: Any
) -> tuple[MaskedAutoencoder, LoadReport]:
    """A ``MaskedAutoencoderViT`` (encoder and decoder) from a checkpoint that has a decoder; a
    ``MaskedAutoencoderCNN`` from a CNN pretraining checkpoint (``mae.convert.cnn_loading.cnn_mae``).

    ``overrides`` change ``MaskedAutoencoderViT`` arguments that the file cannot fix (e.g.
    ``mask_strategy``, ``target`` or its older name ``norm_pix_loss``, ``num_heads``, ``decoder_keep_ratio``);
    a new ``img_size``
    rebuilds the fixed sin-cos position embeddings for the new grid. The decoder the file was trained
    with (``decoder_type``, ``decoder_encoder_layers``) cannot be overridden.

    Raises:
        ValueError: an encoder-only file, or overrides of the file's decoder (naming the key).
    """
    ckpt = source if isinstance(source, MAECheckpoint) else read_checkpoint(source, format)
    return ckpt.model_family.load_mae(ckpt, overrides)


def vit_mae(ckpt: MAECheckpoint, overrides: dict[str, Any]) -> tuple[MaskedAutoencoderViT, LoadReport]:
    """``load_mae`` of a read ViT checkpoint (the ``vit`` row of ``MODEL_FAMILIES``)."""
    if not ckpt.has_decoder:
        raise ConfigError(
            f"{ckpt.source} holds an encoder only (no decoder_* weights; an exported encoder or a fine-tuned "
            f"classifier), so it cannot reconstruct images: reconstruction needs the full MAE, as in our "
            f"pretraining checkpoints (runs/<name>/version_N/checkpoints/*.ckpt), the official "
            f"mae_visualize_vit_*.pth files or a Hugging Face ViTMAEForPreTraining folder. For features or "
            f"fine-tuning use mae.load_backbone"
        )
    changed = switch_differences(
        ckpt.config, overrides, tuple(k for k in _DECODER_ARCHITECTURE if k in overrides)
    )
    if changed:
        raise ConfigError(
            f"{ckpt.source}: its decoder was trained as recorded, so load_mae cannot rebuild it otherwise: "
            + "; ".join(changed)
            + "; leave these out of the overrides (mae.load_backbone reads the encoder of any variant)"
        )
    recorded = dict(ckpt.config)
    if {"target", "norm_pix_loss"} & set(overrides):  # the override names the target, under either name
        recorded.pop("target", None)
        recorded.pop("norm_pix_loss", None)
    config = {**recorded, **overrides}
    state = dict(ckpt.state_dict)
    check_finite(state, ckpt.source)
    model = build_mae(**config)
    report = LoadReport(ckpt.source, ckpt.format, notes=list(ckpt.notes), config=config)
    if model.pos_embed.shape != state["pos_embed"].shape:
        # Fixed sin-cos embeddings: the new grid's are exact, nothing to interpolate.
        state.pop("pos_embed")
        state.pop("decoder_pos_embed", None)
        report.notes.append("fixed sin-cos position embeddings rebuilt for the new image size")
    # A joint checkpoint's classifier (mae.training.joint) beside its MAE: not part of the MAE.
    load_checked(
        model, state, report, allowed_missing=["pos_embed", "decoder_pos_embed"], allowed_ignored=_CLASSIFIER
    )
    log.info("%s", report)
    return model, report


def init_mae_from(model: MaskedAutoencoder, source: str | Path, format: str = "auto") -> LoadReport:
    """Load pretrained weights into ``model`` to start a new run from them (not a resume), as its family
    does: ``init_vit_mae_from`` for a ViT, ``mae.convert.cnn_loading.init_cnn_mae_from`` for a CNN (any timm
    checkpoint of its encoder's architecture)."""
    family = getattr(model, "family", "vit")
    return MODEL_FAMILIES[family].init_from(model, source, format)


def init_vit_mae_from(model: MaskedAutoencoderViT, source: str | Path, format: str = "auto") -> LoadReport:
    """Load pretrained weights into ``model`` to start a new run from them (not a resume).

    The encoder comes from any format ``read_checkpoint`` reads; the decoder too when the file has
    one, else it stays as initialised. Input channels are adapted (``adapt_patch_embed``; the
    decoder's pixel predictor then stays new); the fixed sin-cos position embeddings are never
    copied but stay those of ``model``'s grid, whatever the file's.

    Raises:
        ValueError: naming the file: a fine-tuned classifier, another patch size, another width or
            depth (the key and both shapes), or a file that is not a checkpoint.
    """
    ckpt = read_checkpoint(source, format)
    if any(key.startswith(("head.", "fc_norm.")) for key in ckpt.state_dict):
        raise ConfigError(
            f"{source} is a fine-tuned classifier (it has a head): model.init_from needs pretrained MAE "
            "weights, e.g. our pretraining checkpoint, the official mae_pretrain_vit_*.pth or "
            "mae_visualize_vit_*.pth"
        )
    patch = ckpt.config["patch_size"]
    if patch != model.patch_size:
        raise ConfigError(
            f"{source} was pretrained with {patch}x{patch}-pixel patches, but this model has "
            f"{model.patch_size}x{model.patch_size}: choose the model of its patch size (e.g. model.model "
            f"..._patch{patch})"
        )
    changed = switch_differences(ckpt.config, model.config, ("decoder_type",)) if ckpt.has_decoder else []
    if changed:
        raise ConfigError(
            f"{source} holds another decoder than this model: model.{changed[0]}; set model.decoder_type to "
            "the file's to continue from its decoder (a file without a decoder starts any decoder fresh)"
        )
    report = LoadReport(str(source), ckpt.format, notes=list(ckpt.notes), config=model.config)
    check_finite(ckpt.state_dict, source)
    state = adapt_patch_embed(dict(ckpt.state_dict), model.config["in_chans"], report)
    state = {k: v for k, v in state.items() if k not in ("pos_embed", "decoder_pos_embed")}
    report.notes.append(f"fixed sin-cos position embeddings are those of the model's {model.grid_size} grid")
    allowed_missing = ["pos_embed", "decoder_pos_embed"]
    if not ckpt.has_decoder:
        allowed_missing += ["decoder_*", "mask_token"]
        report.notes.append("the file has no decoder: the decoder starts from its initialisation")
    elif state["decoder_pred.weight"].shape != model.decoder_pred.weight.shape or not same_prediction(
        target_of(ckpt.config), model.target.name
    ):
        state = {k: v for k, v in state.items() if not k.startswith("decoder_pred.")}
        allowed_missing.append("decoder_pred.*")
        report.notes.append(
            f"decoder_pred (the file's predicts target {target_of(ckpt.config)} of "
            f"{ckpt.config['in_chans']} channels) starts from its initialisation"
        )
    load_checked(model, state, report, allowed_missing=allowed_missing)
    return report
