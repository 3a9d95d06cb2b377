"""The base of every module that trains on a pretrained encoder (fine-tuning and linear probing,
detection, segmentation): the settings they share, written once, checked once, and the encoder they
start from.

LightningCLI reads these settings through each subclass's ``**kwargs`` (jsonargparse follows them to
this signature), so a config keeps its keys (``model.base_lr``, ``model.layer_decay``, ...) and a new
shared option is added here alone. A subclass restates a setting only to give it its task's default.
"""

import pickle
from contextvars import ContextVar
from pathlib import Path
from typing import Any, Literal

import torch
from lightning.pytorch.utilities import rank_zero_info
from lightning.pytorch.utilities.model_helpers import _restricted_classmethod
from timm.layers import to_2tuple
from timm.models import VisionTransformer

from mae.convert.backbone import build_vit, load_backbone, pooling_of
from mae.convert.sources import MAECheckpoint, read_checkpoint
from mae.errors import ConfigError, MissingFileError
from mae.models import create_model
from mae.training.base import MAETrainingModule, check_kernel_settings
from mae.training.optim import check_schedule_settings

# The encoder architecture a trained checkpoint records (its MAE config), so that it loads anywhere.
ENCODER_KEY = "mae_encoder_config"
# Set while ``load_from_checkpoint`` rebuilds a trained module: the encoder config it recorded.
_RESTORING: ContextVar[dict[str, Any] | None] = ContextVar("restoring_encoder", default=None)


def check_checkpoint_exists(checkpoint: str | None) -> None:
    """Raises FileNotFoundError naming ``model.checkpoint`` and the two ways on, when it is missing."""
    if checkpoint is not None and not Path(checkpoint).exists():
        raise MissingFileError(
            f"model.checkpoint {checkpoint} does not exist: point it at pretrained weights (for the default "
            f"config, run `mae pretrain --config default` first) or set it to null "
            f"to train from a random initialisation"
        )


class TransferModule(MAETrainingModule):
    """A network trained from a pretrained MAE encoder (or the same encoder freshly initialised).

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
    ) -> None:
        super().__init__()
        self.save_hyperparameters()  # with the subclasses' own arguments: Lightning reads every __init__ frame
        check_kernel_settings(attention, compile, fused_adamw)
        check_schedule_settings(base_lr, lr, min_lr, warmup_epochs)
        if not 0 < layer_decay <= 1:
            raise ConfigError(f"model.layer_decay must be in (0, 1], got {layer_decay}")
        if num_classes < 2:
            raise ConfigError(f"model.num_classes must be >= 2 ({self.num_classes_rule}), got {num_classes}")

    def pretrained_vit(
        self, global_pool: str | None = None, **vit_kwargs: Any
    ) -> tuple[VisionTransformer, dict[str, Any], MAECheckpoint | None]:
        """The encoder as a timm ViT at ``img_size`` with ``vit_kwargs``: loaded from ``checkpoint`` (read
        once; its load report logged), or freshly initialised at the size of ``model``; with its MAE config
        and the read checkpoint (None without one). ``global_pool``: None loads every norm the checkpoint
        holds (``pooling_of``; "token" for a fresh encoder).

        Raises:
            FileNotFoundError: ``checkpoint`` does not exist, naming ``model.checkpoint``.
        """
        hp = self.hparams
        restoring = _RESTORING.get()
        if restoring is not None:  # a trained checkpoint: every weight comes from its state dict
            self.encoder_config = restoring
            return build_vit(restoring, hp.img_size, global_pool or "token", **vit_kwargs), restoring, None
        check_checkpoint_exists(hp.checkpoint)
        if hp.checkpoint is None:
            with torch.device("meta"):
                config = create_model(hp.model, img_size=hp.img_size, in_chans=hp.in_chans,
                                      **(hp.model_kwargs or {})).config  # fmt: skip
            self.encoder_config = config
            return build_vit(config, hp.img_size, global_pool or "token", **vit_kwargs), config, None
        ckpt = read_checkpoint(hp.checkpoint, hp.checkpoint_format)
        vit = load_backbone(ckpt, hp.img_size, global_pool or pooling_of(ckpt), in_chans=hp.in_chans, **vit_kwargs)
        rank_zero_info(str(vit.load_report))
        self.encoder_config = {**vit.load_report.config, "in_chans": hp.in_chans}
        return vit, vit.load_report.config, ckpt

    def on_save_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        super().on_save_checkpoint(checkpoint)
        config = dict(self.encoder_config)
        config["img_size"] = list(to_2tuple(config["img_size"]))
        checkpoint[ENCODER_KEY] = config

    @classmethod
    def restored_kwargs(cls, checkpoint: dict[str, Any]) -> dict[str, Any]:
        """Settings ``load_from_checkpoint`` takes from the trained checkpoint beyond its hyperparameters
        (what the starting checkpoint used to give: e.g. the dense tasks' input normalisation)."""
        return {}

    @_restricted_classmethod  # as Lightning's: called on the class, not on an instance
    def load_from_checkpoint(cls, checkpoint_path: Any, *args: Any, **kwargs: Any):
        """Lightning's ``load_from_checkpoint``, without the starting checkpoint: a trained checkpoint
        holds every weight and records its encoder's architecture, so it loads on any machine and in any
        folder, also when ``model.checkpoint`` (the pretraining file it started from) is not there.
        A checkpoint written before that record existed still needs its starting checkpoint."""
        from lightning.fabric.utilities.cloud_io import _load as pl_load

        try:  # tensors and plain values only: a file whose unpickling would run code is left to Lightning's rules
            saved = pl_load(checkpoint_path, map_location="cpu", weights_only=True)
        except pickle.UnpicklingError:
            saved = {}
        record, restored = saved.get(ENCODER_KEY), cls.restored_kwargs(saved)
        del saved  # Lightning reads the file again: not two copies of its weights at once
        if record is None:
            return super().load_from_checkpoint(checkpoint_path, *args, **kwargs)
        token = _RESTORING.set(record)
        try:
            return super().load_from_checkpoint(checkpoint_path, *args, **{**restored, **kwargs})
        finally:
            _RESTORING.reset(token)
