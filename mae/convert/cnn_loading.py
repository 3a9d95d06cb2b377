"""The CNN row's loaders (``mae.convert.families.MODEL_FAMILIES["cnn"]``): a CNN checkpoint as the plain timm
model (``cnn_backbone``, for ``load_backbone``), as the whole ``MaskedAutoencoderCNN`` (``cnn_mae``, for
``load_mae``), and any timm checkpoint of a model's encoder architecture as the start of a pretraining run
(``init_cnn_mae_from``, for ``model.init_from``).

The encoder is ``timm.create_model(encoder, ...)`` itself, so every load is timm's state dict into timm's
model, strict: what is left out (a new classifier head, the tensors the masked encoder never uses) is named
in the load report. A file of another architecture is refused naming both.
"""

import logging
import sys
from pathlib import Path
from typing import Any

import timm
import torch
from torch import nn

from mae.convert.backbone import adapt_patch_embed, same_prediction
from mae.convert.checkpoint import MAECheckpoint, check_finite
from mae.convert.families import CNN_PREFIX
from mae.convert.formats import exported_encoder, lightning, official
from mae.convert.formats.base import CheckpointPath
from mae.convert.report import LoadReport, load_checked
from mae.convert.sources import read_checkpoint
from mae.errors import ConfigError
from mae.models.cnn import MaskedAutoencoderCNN
from mae.models.factory import build_model
from mae.models.targets import target_of

log = logging.getLogger(__name__)

# What fixes the tensors of a CNN checkpoint: ``load_mae`` cannot rebuild it otherwise.
_FIXED_BY_WEIGHTS = ("encoder", "decoder", "mask_unit", "decoder_width", "decoder_depth", "encoder_kwargs")


def first_conv_key(model: nn.Module) -> str:
    """The weight of a timm model's input convolution (``pretrained_cfg["first_conv"]``)."""
    return f"{model.pretrained_cfg['first_conv']}.weight"


def classifier_prefix(model: nn.Module) -> str:
    """Where a timm model's classifier sits (``pretrained_cfg["classifier"]``, "fc", "head.fc"), dotted."""
    return f"{model.pretrained_cfg['classifier']}."


def cnn_backbone(
    ckpt: MAECheckpoint,
    img_size: int | tuple[int, int] | None,
    global_pool: str | None,
    num_classes: int,
    num_heads: int | None,
    in_chans: int | None,
    **timm_kwargs: Any,
) -> nn.Module:
    """The timm CNN of ``ckpt`` with its weights, loaded strictly: ``timm.create_model(encoder,
    num_classes=num_classes, in_chans=..., global_pool="avg")``. ``num_classes`` > 0 gives a new head (a
    head of that size in the file is loaded); ``img_size`` is only recorded (a CNN takes any size);
    ``in_chans`` adapts the first convolution.

    Raises:
        ConfigError: a ``global_pool`` other than "avg" or ``num_heads`` (a ViT's), naming the encoder.
        InputError: tensors that do not fit the timm model, naming them.
    """
    config = dict(ckpt.config)
    encoder = config["encoder"]
    if global_pool not in (None, "avg"):
        raise ConfigError(
            f"global_pool {global_pool!r} pools a ViT's cls token; {ckpt.source} holds the CNN {encoder}, "
            "which pools the mean of its last map: use global_pool 'avg'"
        )
    if num_heads is not None:
        raise ConfigError(
            f"num_heads is a ViT's; {ckpt.source} holds the CNN {encoder}, which has no attention heads: "
            "leave --num-heads out"
        )
    chans = config["in_chans"] if in_chans is None else in_chans
    args = {**(config.get("encoder_kwargs") or {}), **timm_kwargs}
    try:
        model = timm.create_model(
            encoder, pretrained=False, num_classes=num_classes, in_chans=chans, global_pool="avg", **args
        )
    except TypeError as err:
        raise ConfigError(f"the CNN {encoder} of {ckpt.source} does not take {sorted(args)}: {err}") from None
    if img_size is not None:
        config["img_size"] = img_size
    config["in_chans"] = chans
    report = LoadReport(ckpt.source, ckpt.format, notes=list(ckpt.notes), config=config)
    state = ckpt.encoder_state_dict()
    check_finite(state, ckpt.source)
    state = adapt_patch_embed(state, chans, report, first_conv_key(model), "first convolution")
    head = classifier_prefix(model)
    own_head = {k: v.shape for k, v in model.state_dict().items() if k.startswith(head)}
    file_head = {k: v.shape for k, v in state.items() if k.startswith(head)}
    if file_head and file_head != own_head:
        state = {k: v for k, v in state.items() if not k.startswith(head)}
        report.notes.append("the source's classification head has another number of classes: not loaded")
    load_checked(model, state, report, allowed_missing=[f"{head}*"] if num_classes else [])
    report.ignored += sorted(k for k in ckpt.state_dict if not k.startswith(CNN_PREFIX)) + ckpt.ignored
    log.info("%s", report)
    model.load_report = report
    return model


def cnn_mae(ckpt: MAECheckpoint, overrides: dict[str, Any]) -> tuple[MaskedAutoencoderCNN, LoadReport]:
    """The ``MaskedAutoencoderCNN`` of a CNN pretraining checkpoint, every tensor loaded; ``overrides``
    change what the weights do not fix (``mask_strategy``, ``target`` of the same kind, ``img_size``).

    Raises:
        ConfigError: a checkpoint without a decoder, or overrides of what its tensors fix (by name).
    """
    if not ckpt.has_decoder:
        raise ConfigError(
            f"{ckpt.source} holds the encoder of the CNN {ckpt.config['encoder']} only (no decoder), so it "
            "cannot reconstruct images: reconstruction needs the pretraining checkpoint "
            "(runs/<name>/version_N/checkpoints/*.ckpt). For features or fine-tuning use mae.load_backbone"
        )
    fixed = [
        f"{k}={overrides[k]!r} (the file's: {ckpt.config.get(k)!r})"
        for k in _FIXED_BY_WEIGHTS
        if k in overrides
    ]
    if fixed:
        raise ConfigError(
            f"{ckpt.source}: its encoder and decoder were trained as recorded, so load_mae cannot rebuild "
            f"them otherwise: {'; '.join(fixed)}; leave these out of the overrides"
        )
    config = {**ckpt.config, **overrides}
    state = dict(ckpt.state_dict)
    check_finite(state, ckpt.source)
    model = build_model(**config)
    report = LoadReport(ckpt.source, ckpt.format, notes=list(ckpt.notes), config=config)
    load_checked(model, state, report)
    log.info("%s", report)
    return model, report


def init_cnn_mae_from(model: MaskedAutoencoderCNN, source: str | Path, format: str = "auto") -> LoadReport:
    """Start ``model``'s pretraining from the weights in ``source``: any timm checkpoint of its encoder's
    architecture (a timm state dict file or ``.safetensors``, a timm folder, timm's ``convnextv2_*.fcmae``
    weights, the official ConvNeXt / ConvNeXt-V2 files, remapped by timm's own ``checkpoint_filter_fn``), or
    our CNN checkpoints and exports of the same encoder. The decoder too when the file holds one of the same
    shape, else it starts from its initialisation. A classifier head in the file is left out (noted); the
    tensors the masked encoder never uses (ConvNeXt's head norm) may be missing, as in timm's fcmae files.

    Raises:
        ConfigError: a checkpoint of another architecture (a ViT, another timm model), naming both.
        InputError: tensors that do not fit the encoder, naming them.
    """
    encoder = model.config["encoder"]
    raw = _timm_tensors(Path(source)) if format in ("auto", "timm", "official") else None
    if raw is None:
        ckpt = read_checkpoint(source, format)
        _check_same_architecture(ckpt, encoder, source)
        state, fmt, notes = ckpt.encoder_state_dict(), ckpt.format, list(ckpt.notes)
    else:
        ckpt, state, fmt, notes = None, raw, "timm", []
        if "patch_embed.proj.weight" in raw:
            raise ConfigError(
                f"{source} holds a ViT (patch_embed.proj.weight); this model's encoder is the CNN {encoder}: "
                "start it from weights of a timm "
                f"{encoder}, or pretrain a ViT (model.model mae_vit_*) from this file"
            )
    report = LoadReport(str(source), fmt, notes=notes, config=model.config)
    check_finite(state, source)
    state = _timm_layout(state, model.encoder, report)
    if first_conv_key(model.encoder) in state:  # else another architecture, refused below
        state = adapt_patch_embed(
            state, model.config["in_chans"], report, first_conv_key(model.encoder), "first convolution"
        )
    unused = [f"{CNN_PREFIX}{n}" for n, p in model.encoder.named_parameters() if not p.requires_grad]
    difference = _difference(model.encoder.state_dict(), state, [n[len(CNN_PREFIX) :] for n in unused])
    if difference:
        raise ConfigError(
            f"{source} holds another architecture than this model's encoder {encoder} ({difference}): "
            f"start from weights of a timm {encoder}, or set model.model_kwargs.encoder to the file's model"
        )
    full = {f"{CNN_PREFIX}{k}": v for k, v in state.items()}
    allowed = [*unused, "decoder.*", "target.*"]
    if ckpt is not None and ckpt.has_decoder and _same_decoder(ckpt.config, model.config):
        full.update({k: v for k, v in ckpt.state_dict.items() if not k.startswith(CNN_PREFIX)})
        allowed = unused
    else:
        report.notes.append("the decoder starts from its initialisation (the file has none of this shape)")
    load_checked(model, full, report, allowed_missing=allowed)
    return report


def _check_same_architecture(ckpt: MAECheckpoint, encoder: str, source: str | Path) -> None:
    """Refuse a read checkpoint whose encoder is not ``encoder``, naming both."""
    if ckpt.family != "cnn":
        raise ConfigError(
            f"{source} holds a ViT encoder ({ckpt.config.get('embed_dim')} wide, {ckpt.config.get('depth')} "
            f"blocks); this model's encoder is the CNN {encoder}: start it from weights of a timm {encoder}, "
            "or pretrain a ViT (model.model mae_vit_*) from this file"
        )
    if ckpt.config["encoder"] != encoder:
        raise ConfigError(
            f"{source} holds a {ckpt.config['encoder']} encoder; this model's encoder is {encoder}: set "
            f"model.model_kwargs.encoder {ckpt.config['encoder']} to continue from it"
        )


def _same_decoder(file: dict[str, Any], own: dict[str, Any]) -> bool:
    """Whether the file's decoder computes what ``own``'s would: same kind, widths, cell and target kind."""
    keys = ("decoder", "decoder_width", "decoder_depth", "mask_unit", "in_chans")
    return all(file.get(k) == own.get(k) for k in keys) and same_prediction(target_of(file), target_of(own))


def _timm_tensors(path: Path) -> dict[str, torch.Tensor] | None:
    """The tensors of a file that names no architecture: a plain state dict (timm's, a ``.safetensors``)
    or an official ``{"model": state_dict}`` file; None for a folder and for our own files (they are read
    with their records)."""
    if path.is_dir():
        return None
    checkpoint = CheckpointPath(path)
    if exported_encoder.detect(checkpoint) or lightning.detect(checkpoint):
        return None
    if official.detect(checkpoint):
        return checkpoint.contents["model"]
    return checkpoint.state_dict()


def _timm_layout(
    state: dict[str, torch.Tensor], encoder: nn.Module, report: LoadReport
) -> dict[str, torch.Tensor]:
    """``state`` in the names of the timm model ``encoder``: remapped by its timm module's own
    ``checkpoint_filter_fn`` when it has one (ConvNeXt's turns the official layout, ``downsample_layers``,
    ``dwconv``, ``pwconv``, ``grn``, into timm's), its classifier head left out (noted)."""
    remap = getattr(sys.modules[type(encoder).__module__], "checkpoint_filter_fn", None)  # imported: built
    if remap is not None:
        remapped = remap(state, encoder)
        if set(remapped) != set(state):
            report.notes.append(
                f"tensor names remapped to timm's by {type(encoder).__module__}.checkpoint_filter_fn"
            )
        state = remapped
    head = classifier_prefix(encoder)
    dropped = sorted(k for k in state if k.startswith(head))
    if dropped:
        report.notes.append(f"the file's classifier head ({head}*) is not part of the encoder: not loaded")
    return {k: v for k, v in state.items() if not k.startswith(head)}


def _difference(own: dict[str, torch.Tensor], given: dict[str, torch.Tensor], may_miss: list[str]) -> str:
    """How the tensors ``given`` differ from a model's ``own``, in short (counts and the first names); empty
    when they fit."""
    shapes = [k for k in own if k in given and own[k].shape != given[k].shape]
    missing = [k for k in own if k not in given and k not in may_miss]
    extra = [k for k in given if k not in own]
    parts = []
    if shapes:
        key = shapes[0]
        parts.append(
            f"{len(shapes)} tensor(s) of other shapes, e.g. {key} {tuple(given[key].shape)} in the file, "
            f"{tuple(own[key].shape)} in the model"
        )
    if missing:
        parts.append(f"{len(missing)} of the model's tensors missing, e.g. {', '.join(missing[:3])}")
    if extra:
        parts.append(f"{len(extra)} tensors the model does not have, e.g. {', '.join(extra[:3])}")
    return "; ".join(parts)
