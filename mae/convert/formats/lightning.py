"""Our checkpoints: the Lightning ``.ckpt`` files ``mae pretrain``, ``mae finetune`` and ``mae distill`` write
(a distilled student is recorded as a ``VisionTransformer`` under ``student.``, as a fine-tuned one under
``vit.``).

The architecture comes from the record of ``mae.convert.architecture`` (checked against the tensors
first); files written before it (version 0.1) give it through the fine-tuning module's encoder config
or the pretraining module's hyperparameters. Training writes this format (``mae.training``); sharded
folders of it are ``mae.convert.formats.sharded``.
"""

from pathlib import Path

import torch

from mae.convert.architecture import ARCHITECTURE_KEY, DATA_KEY, encoder_config
from mae.convert.checkpoint import MAECheckpoint
from mae.convert.families import CNN_PREFIX, FAMILY_OF_CLASS, MODEL_FAMILIES, TIMM_LAYOUT_CLASSES
from mae.convert.formats.base import CheckpointFormat, CheckpointPath
from mae.convert.shapes import infer_config
from mae.errors import InputError
from mae.models.factory import MODEL_REGISTRY, create_model

# The pretraining module's own arguments that version 0.1 kept out of ``model_kwargs``.
_V0_1_PRETRAIN_ARGS = ("img_size", "norm_pix_loss", "mask_strategy")


def detect(checkpoint: CheckpointPath) -> bool:
    """A dict with Lightning's ``state_dict`` and ``pytorch-lightning_version``."""
    contents = checkpoint.contents
    return isinstance(contents, dict) and "state_dict" in contents and "pytorch-lightning_version" in contents


def read(checkpoint: CheckpointPath) -> MAECheckpoint:
    return read_dict(checkpoint.path, checkpoint.contents)


def read_dict(path: Path, obj: dict) -> MAECheckpoint:
    """The Lightning checkpoint dict ``obj`` read from ``path`` (a file, or a sharded folder's
    consolidated dict).

    Raises:
        InputError: a record that disagrees with the tensors or names no weights, naming ``path``.
    """
    record = obj.get(ARCHITECTURE_KEY)
    if record is None:
        return _read_v0_1(path, obj)
    prefix = record.get("state_dict_prefix", "model.")
    state = {k[len(prefix) :]: v for k, v in obj["state_dict"].items() if k.startswith(prefix)}
    if not state:
        raise InputError(
            f"{path}: its {ARCHITECTURE_KEY} record says the weights are under {prefix!r}, but none are"
        )
    config = encoder_config(record, str(path))
    family = FAMILY_OF_CLASS[record["class"]]
    if record["class"] in TIMM_LAYOUT_CLASSES:  # a timm CNN's own names: the CNN family's layout
        state = {f"{CNN_PREFIX}{k}": v for k, v in state.items()}
    MODEL_FAMILIES[family].check_record(config, state, path)
    return MAECheckpoint(str(path), "lightning", state, config, data=obj.get(DATA_KEY), family=family)


def _read_v0_1(path: Path, obj: dict) -> MAECheckpoint:
    """Checkpoints written before the architecture record: the fine-tuning module stored its encoder
    config; the pretraining module's architecture is rebuilt from its hyperparameters."""
    if "mae_encoder_config" in obj:
        state = {k[len("vit.") :]: v for k, v in obj["state_dict"].items() if k.startswith("vit.")}
        config = {**obj["mae_encoder_config"], "img_size": tuple(obj["mae_encoder_config"]["img_size"])}
        return MAECheckpoint(str(path), "lightning", state, config)
    state = {k[len("model.") :]: v for k, v in obj["state_dict"].items() if k.startswith("model.")}
    if not state:
        raise InputError(
            f"{path} is a Lightning checkpoint without 'model.*' weights: not written by mae pretrain or mae "
            "finetune"
        )
    hp = obj.get("hyper_parameters", {})
    if hp.get("model") not in MODEL_REGISTRY:
        config, notes = infer_config(state, source=path)
        return MAECheckpoint(str(path), "lightning", state, config, notes)
    kwargs = dict(hp.get("model_kwargs") or {})
    kwargs.update({key: hp[key] for key in _V0_1_PRETRAIN_ARGS if key in hp})
    with torch.device("meta"):
        config = create_model(hp["model"], **kwargs).config
    return MAECheckpoint(str(path), "lightning", state, config)


FORMAT = CheckpointFormat(
    name="Lightning checkpoint (mae pretrain / mae finetune)",
    format="lightning",
    looks_for="a dict with 'state_dict' and 'pytorch-lightning_version'",
    detect=detect,
    read=read,
)
