"""``MAECheckpoint``: any checkpoint format read into one layout, the official MAE / timm names, with the
architecture it needs (``mae.convert.sources.read_checkpoint`` reads one)."""

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from mae.convert.families import MODEL_FAMILIES, ModelFamily
from mae.errors import InputError


@dataclass
class MAECheckpoint:
    """A checkpoint in the official MAE layout, with the architecture it needs.

    Attributes:
        source: the file or folder it was read from.
        format: the detected or given format (a name of ``mae.convert.sources.FORMATS``).
        state_dict: official MAE keys (encoder keys are timm ``VisionTransformer`` keys).
        config: ``MaskedAutoencoderViT`` arguments (decoder ones only meaningful with a decoder).
        notes: assumptions made where the file did not say (e.g. the number of heads).
        ignored: source tensors with no place in an MAE / ViT (e.g. a Hugging Face pooler).
        data: the ``mae_data`` record of our checkpoints (``mae.convert.architecture``), else None.
        family: the model family, a key of ``mae.convert.families.MODEL_FAMILIES``: "vit" (every file
            before 0.5.0) or "cnn" (``state_dict`` then holds ``encoder.<timm key>`` and the decoder's).
    """

    source: str
    format: str
    state_dict: dict[str, torch.Tensor]
    config: dict[str, Any]
    notes: list[str] = field(default_factory=list)
    ignored: list[str] = field(default_factory=list)
    data: dict[str, Any] | None = None  # how the training run normalised images (``mae_data``), when known
    family: str = "vit"

    @property
    def model_family(self) -> ModelFamily:
        """This checkpoint's row of ``MODEL_FAMILIES``."""
        return MODEL_FAMILIES[self.family]

    @property
    def has_decoder(self) -> bool:
        return self.model_family.has_decoder(self.state_dict)

    def encoder_state_dict(self) -> dict[str, torch.Tensor]:
        """The timm encoder's tensors in timm's names: a ViT's all but ``mask_token`` and ``decoder_*``, a
        CNN's ``encoder.`` part without the prefix."""
        return self.model_family.encoder_state(self.state_dict)


def check_finite(state: dict[str, torch.Tensor], source: str | Path) -> None:
    """Refuse weights that hold a NaN or an infinity (a diverged run's checkpoint): every output of the
    model would be NaN without a word (NaN embeddings, a reconstruction figure of loss nan).

    Raises:
        InputError: naming ``source``, the first bad tensor and how many of its values are bad.
    """
    for name, tensor in state.items():
        if tensor.is_floating_point() or tensor.is_complex():
            bad = int((~torch.isfinite(tensor)).sum())
            if bad:
                raise InputError(
                    f"{source} holds non-finite weights: {name} has {bad:,} NaN or infinite value(s) of "
                    f"{tensor.numel():,} (the first such tensor); the run that wrote it diverged: use an "
                    "earlier checkpoint of that run"
                )
