"""The base of every module that trains on a pretrained encoder (fine-tuning and linear probing,
detection, segmentation): the settings they share, written once, checked once, and the encoder they
start from.

LightningCLI reads these settings through each subclass's ``**kwargs`` (jsonargparse follows them to
this signature), so a config keeps its keys (``model.base_lr``, ``model.layer_decay``, ...) and a new
shared option is added here alone. A subclass restates a setting only to give it its task's default.

A trained module rebuilds itself with Lightning's own ``load_from_checkpoint``: its hyperparameters
record the encoder's architecture (``encoder_config``), filled in when the encoder is first built, so
the pretraining file named by ``model.checkpoint`` is read once, when training starts, and never again.
"""

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import torch
from lightning.pytorch.utilities import rank_zero_info
from timm.layers import to_2tuple
from timm.models import VisionTransformer

from mae.convert.architecture import DATA_KEY
from mae.convert.backbone import build_vit, load_backbone, pooling_of
from mae.convert.safe_load import safe_torch_load
from mae.convert.sources import MAECheckpoint, read_checkpoint
from mae.errors import ConfigError, MissingFileError
from mae.models import create_model
from mae.training.base import KernelChoices, LrSchedule, MAETrainingModule

# Where version 0.2 kept the encoder's architecture in a trained checkpoint: beside its hyperparameters.
ENCODER_KEY_V0_2 = "mae_encoder_config"


def check_checkpoint_exists(checkpoint: str | None) -> None:
    """Raises MissingFileError naming ``model.checkpoint`` and the two ways on, when it is missing."""
    if checkpoint is not None and not Path(checkpoint).exists():
        raise MissingFileError(
            f"model.checkpoint {checkpoint} does not exist: point it at pretrained weights (for the default "
            f"config, run `mae pretrain --config default` first) or set it to null "
            f"to train from a random initialisation"
        )


@dataclass(frozen=True)
class EncoderSource:
    """Where a transfer's encoder comes from: its recorded architecture (``record``: a trained module's
    ``encoder_config``; every weight then comes from the trained checkpoint's state dict), else the
    pretrained weights in ``checkpoint``, else a fresh encoder of the size ``model`` with ``model_kwargs``."""

    checkpoint: str | None = None
    checkpoint_format: str = "auto"
    model: str = "mae_vit_base_patch16"
    model_kwargs: dict[str, Any] | None = None
    record: dict[str, Any] | None = None

    def build(
        self, img_size: int | tuple[int, int], in_chans: int, global_pool: str | None = None, **vit_kwargs: Any
    ) -> tuple[VisionTransformer, dict[str, Any], MAECheckpoint | None]:
        """The encoder as a timm ViT at ``img_size`` with ``vit_kwargs``, its MAE config and the read
        checkpoint (None unless built from ``checkpoint``, which is then read once and its load report
        logged). ``global_pool``: None loads every norm the checkpoint holds (``pooling_of``; "token" otherwise).

        Raises:
            MissingFileError: ``checkpoint`` is needed and does not exist, naming ``model.checkpoint``.
        """
        if self.record is not None:
            return build_vit(self.record, img_size, global_pool or "token", **vit_kwargs), dict(self.record), None
        check_checkpoint_exists(self.checkpoint)
        if self.checkpoint is None:
            with torch.device("meta"):
                sized = create_model(self.model, img_size=img_size, in_chans=in_chans, **(self.model_kwargs or {}))
            return build_vit(sized.config, img_size, global_pool or "token", **vit_kwargs), sized.config, None
        ckpt = read_checkpoint(self.checkpoint, self.checkpoint_format)
        vit = load_backbone(ckpt, img_size, global_pool or pooling_of(ckpt), in_chans=in_chans, **vit_kwargs)
        rank_zero_info(str(vit.load_report))
        return vit, vit.load_report.config, ckpt


def encoder_record(config: dict[str, Any], in_chans: int) -> dict[str, Any]:
    """The ``encoder_config`` hyperparameter of an encoder with MAE ``config`` taking ``in_chans``
    channels: plain values (lists, not tuples), as a checkpoint and a YAML file hold them."""
    record = {key: list(value) if isinstance(value, tuple) else value for key, value in config.items()}
    record["img_size"] = list(to_2tuple(config["img_size"]))
    record["in_chans"] = in_chans
    return record


class TransferModule(MAETrainingModule):
    """A network trained from a pretrained MAE encoder (or the same encoder freshly initialised).

    Every argument is kept where it is used: the encoder's origin in ``self.encoder_source``, the
    schedule and kernel choices in ``self.schedule`` / ``self.kernels``, the rest as attributes of the
    same names.

    Args:
        checkpoint: pretrained weights (ours, an export, official MAE, timm or Hugging Face; see
            ``mae.load_backbone``). None: a random encoder of size ``model``.
        checkpoint_format: "auto" or a format name of ``mae.convert.sources.FORMATS``.
        model: MAE size whose encoder is built when ``checkpoint`` is None (e.g. "mae_vit_base_patch16").
        model_kwargs: ``MaskedAutoencoderViT`` overrides for that size (e.g. depth).
        img_size: input size; linked from ``data.img_size`` (position embeddings are resampled when it
            differs from the pretraining size).
        in_chans: image channels; linked from ``data.in_chans`` (the patch embedding of a checkpoint with
            another count is adapted, ``mae.convert.backbone.adapt_patch_embed``).
        num_classes: linked from the data module.
        drop_path_rate: stochastic depth in the encoder (paper: 0.1 B, 0.2 L, 0.3 H).
        layer_decay: layer-wise lr decay on the encoder, in (0, 1] (paper: 0.65 B, 0.75 L/H); 1 disables it.
        base_lr: lr per 256 images; the lr is ``base_lr x effective batch / 256``.
        lr: absolute lr, overriding the scaling rule when set.
        min_lr: lr at the end of the cosine.
        weight_decay: decay on weights (not on biases and norms).
        warmup_epochs: linear warmup length in (fractional) epochs.
        attention: attention kernel, "sdpa" or "explicit"; "auto" as ``mae.training.runtime`` measured.
        compile: ``torch.compile`` the network (off by default; "auto" as for pretraining).
        fused_adamw: the single-kernel AdamW ("auto": where the device has it).
        encoder_config: the encoder's architecture (``MaskedAutoencoderViT`` arguments). Leave it None: the
            module fills it in from ``checkpoint`` (or ``model``) when it builds the encoder, and its
            checkpoints record it, so that ``load_from_checkpoint`` builds the same encoder (its weights
            from the checkpoint's state dict) without reading ``checkpoint`` again. When set,
            ``checkpoint``, ``model`` and ``model_kwargs`` are not read.
    """

    num_classes_rule = "a classifier"  # what the two classes at least are, for the error message

    def __init__(
        self,
        checkpoint: str | None = None,
        checkpoint_format: str = "auto",
        model: str = "mae_vit_base_patch16",
        model_kwargs: dict[str, Any] | None = None,
        img_size: int | tuple[int, int] = 224,
        in_chans: int = 3,
        num_classes: int = 1000,
        drop_path_rate: float = 0.1,
        layer_decay: float = 0.65,
        base_lr: float = 5e-4,
        lr: float | None = None,
        min_lr: float = 1e-6,
        weight_decay: float = 0.05,
        warmup_epochs: float = 5.0,
        attention: Literal["auto", "sdpa", "explicit"] = "auto",
        compile: bool | Literal["auto"] = False,
        fused_adamw: bool | Literal["auto"] = "auto",
        encoder_config: dict[str, Any] | None = None,
    ) -> None:
        super().__init__(LrSchedule(base_lr, lr, min_lr, warmup_epochs), KernelChoices(attention, compile, fused_adamw))
        self.save_hyperparameters()  # with the subclasses' own arguments: Lightning reads every __init__ frame
        if not 0 < layer_decay <= 1:
            raise ConfigError(f"model.layer_decay must be in (0, 1], got {layer_decay}")
        if num_classes < 2:
            raise ConfigError(f"model.num_classes must be >= 2 ({self.num_classes_rule}), got {num_classes}")
        self.encoder_source = EncoderSource(checkpoint, checkpoint_format, model, model_kwargs, encoder_config)
        self.img_size = img_size
        self.in_chans = in_chans
        self.num_classes = num_classes
        self.drop_path_rate = drop_path_rate
        self.layer_decay = layer_decay
        self.weight_decay = weight_decay

    def pretrained_vit(
        self, global_pool: str | None = None, **vit_kwargs: Any
    ) -> tuple[VisionTransformer, dict[str, Any], MAECheckpoint | None]:
        """The encoder at ``img_size`` with ``vit_kwargs`` (``EncoderSource.build``), its MAE config and
        the read checkpoint; records its architecture in the hyperparameters (``encoder_config``)."""
        vit, config, ckpt = self.encoder_source.build(self.img_size, self.in_chans, global_pool, **vit_kwargs)
        self.hparams.encoder_config = encoder_record(config, self.in_chans)
        return vit, config, ckpt


def restore_kwargs_v0_2(path: str | Path) -> dict[str, Any]:
    """What ``load_from_checkpoint`` needs beyond the hyperparameters of a trained checkpoint written by
    version 0.2, which kept its encoder's architecture (and a dense module's input normalisation) beside
    them: ``MAEDetectionModule.load_from_checkpoint(path, **restore_kwargs_v0_2(path))`` then loads it
    without its pretraining file. Empty for a newer checkpoint, which records both in its hyperparameters."""
    saved = safe_torch_load(path)
    settings = saved.get("hyper_parameters", {})
    if "encoder_config" in settings or ENCODER_KEY_V0_2 not in saved:
        return {}
    # A module with input normalisation settings (the dense ones) recorded what it resolved in mae_data.
    data = saved.get(DATA_KEY) or {}
    resolved = {key: data[key] for key in ("mean", "std") if key in settings and key in data}
    return {"encoder_config": saved[ENCODER_KEY_V0_2], **resolved}
