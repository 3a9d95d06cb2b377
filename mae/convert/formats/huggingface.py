"""Hugging Face transformers' ViT models: ``ViTMAEForPreTraining`` (encoder and decoder), ``ViTMAEModel``
and ``ViTModel`` (the encoder), as a folder (``config.json`` and ``model.safetensors`` or
``pytorch_model.bin``) or as a weights file with its ``config.json`` beside it; ``mae export --to
huggingface`` writes the folder (``write``, with a ``README.md`` card: ``mae.convert.folders``).

The names are converted by ``mae.convert.huggingface``; the architecture comes from ``config.json``. Only
what computes as an MAE ViT is read: exact GELU, query/key/value biases.
"""

import json
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import save_file

from mae.convert.checkpoint import MAECheckpoint
from mae.convert.formats.base import CheckpointFormat, CheckpointPath
from mae.convert.huggingface import (
    from_hf_state_dict,
    hf_classifier_config,
    hf_classifier_state_dict,
    hf_config_of,
    hf_encoder_state_dict,
    to_hf_state_dict,
)
from mae.convert.safe_load import read_safetensors, safe_torch_load
from mae.convert.shapes import infer_config
from mae.errors import InputError, MissingFileError

WEIGHT_FILES = ("model.safetensors", "pytorch_model.bin")
_HF_PREFIXES = ("vit.", "embeddings.", "encoder.layer", "layers.", "layernorm.", "decoder.decoder_")
_HF_IGNORED = ("pooler.", "classifier.", "vit.pooler.")


def folder_weights(folder: Path) -> dict[str, torch.Tensor]:
    """The tensors of a hub folder's ``model.safetensors`` (else ``pytorch_model.bin``).

    Raises:
        MissingFileError: the folder holds neither, naming it.
    """
    if (folder / WEIGHT_FILES[0]).is_file():
        return read_safetensors(folder / WEIGHT_FILES[0])
    if (folder / WEIGHT_FILES[1]).is_file():
        return safe_torch_load(folder / WEIGHT_FILES[1])
    raise MissingFileError(
        f"{folder} holds neither model.safetensors nor pytorch_model.bin (a Hugging Face folder)"
    )


MODEL_TYPES = ("vit_mae", "vit")  # config.json's model_type of the models read here


def detect_folder(checkpoint: CheckpointPath) -> bool:
    """A folder with weights and a ``config.json`` whose ``model_type`` is a ViT MAE's or a ViT's (a timm
    folder's ``config.json`` names no ``model_type``)."""
    folder = checkpoint.path
    if not (folder.is_dir() and any((folder / f).is_file() for f in WEIGHT_FILES)):
        return False
    try:
        hf = json.loads((folder / "config.json").read_text())
    except (OSError, UnicodeDecodeError, ValueError):
        return False
    return isinstance(hf, dict) and hf.get("model_type") in MODEL_TYPES


def read_folder(checkpoint: CheckpointPath) -> MAECheckpoint:
    return read_tensors(checkpoint.path, folder_weights(checkpoint.path))


def detect_file(checkpoint: CheckpointPath) -> bool:
    """A plain state dict in Hugging Face's names (not timm's ``patch_embed``)."""
    state = checkpoint.state_dict()
    return (
        state is not None
        and any(k.startswith(_HF_PREFIXES) for k in state)
        and "patch_embed.proj.weight" not in state
    )


def read_file(checkpoint: CheckpointPath) -> MAECheckpoint:
    return read_tensors(checkpoint.path.parent, checkpoint.state_dict(), checkpoint.path)


def read_tensors(folder: Path, tensors: dict[str, torch.Tensor], path: Path | None = None) -> MAECheckpoint:
    """Hugging Face ``tensors`` (from ``path``, else the folder's own weights) with the ``config.json`` of
    ``folder``, in our names.

    Raises:
        MissingFileError: no ``config.json`` in ``folder``.
        InputError: a model that is not an MAE ViT (another activation, no qkv bias), or a width that
            differs from ``config.json``'s, naming the file.
    """
    config_file = folder / "config.json"
    if not config_file.is_file():
        raise MissingFileError(
            f"Hugging Face weights {path or folder} need their config.json beside them (not found in "
            f"{folder})"
        )
    try:
        hf = json.loads(config_file.read_text())
    except (UnicodeDecodeError, ValueError) as err:
        raise InputError(f"{config_file} is not a JSON file ({err}); a Hugging Face config.json is") from None
    if not isinstance(hf, dict):
        raise InputError(
            f"{config_file} holds a {type(hf).__name__}; a Hugging Face config.json holds an object"
        )
    _check_mae_vit(hf, config_file)
    ignored = sorted(k for k in tensors if k.startswith(_HF_IGNORED))
    kept = {  # ViTMAEModel / ViTModel keys lack the "vit." of ViTMAEForPreTraining
        (key if key.startswith(("vit.", "decoder.")) else f"vit.{key}"): value
        for key, value in tensors.items()
        if key not in ignored
    }
    try:
        state = from_hf_state_dict(kept)
    except KeyError as err:  # a tensor name no ViT MAE has: another model in Hugging Face's layout
        raise InputError(
            f"{path or folder}: {err.args[0]}; not a ViT MAE or ViT in Hugging Face's names"
        ) from None
    config, notes = infer_config(state, _hints(hf), path or folder)
    if config["layer_norm_eps"] != 1e-6:
        notes.append(
            f"layer_norm_eps={config['layer_norm_eps']:g} from config.json (the official MAE uses 1e-6); "
            "kept so outputs match the Hugging Face model"
        )
    width = hf.get("hidden_size", 768)
    if config["embed_dim"] != width:
        raise InputError(f"{config_file}: hidden_size {width} but the weights are {config['embed_dim']} wide")
    return MAECheckpoint(str(path or folder), "huggingface", state, config, notes, ignored)


def _check_mae_vit(hf: dict[str, Any], config_file: Path) -> None:
    if hf.get("hidden_act", "gelu") != "gelu":  # Hugging Face's "gelu" is the exact (erf) GELU of MAE
        raise InputError(
            f"{config_file}: hidden_act is {hf['hidden_act']!r}; MAE ViTs use exact GELU ('gelu'), so this "
            "model would compute something else here"
        )
    if not hf.get("qkv_bias", True):
        raise InputError(
            f"{config_file}: qkv_bias=false models are not MAE ViTs (MAE uses query/key/value biases)"
        )


def _hints(hf: dict[str, Any]) -> dict[str, Any]:
    """What ``config.json`` says that the shapes cannot (heads, input size, eps, ``norm_pix_loss``)."""
    hints = {
        "img_size": hf.get("image_size", 224),
        "num_heads": hf.get("num_attention_heads"),
        "decoder_num_heads": hf.get("decoder_num_attention_heads"),
        "layer_norm_eps": hf.get("layer_norm_eps", 1e-12),
        "norm_pix_loss": bool(hf.get("norm_pix_loss", False)),
    }
    return {k: v for k, v in hints.items() if v is not None}


def write(
    state_dict: dict[str, torch.Tensor],
    config: dict[str, Any],
    folder: Path,
    decoder: bool,
    mask_ratio: float,
    mean: list[float],
    std: list[float],
    num_labels: int | None = None,
) -> None:
    """Write ``config.json``, ``model.safetensors`` and ``preprocessor_config.json`` into ``folder`` (an
    empty, new folder): ``ViTMAEForPreTraining`` with ``decoder`` (``state_dict`` then holds one), a
    ``ViTForImageClassification`` of ``num_labels`` classes when given (``state_dict``: a cls-token
    classifier's, its head one linear layer), else ``ViTMAEModel``; a ``ViTImageProcessor`` resizing to the
    input size (bicubic), scaling 8-bit values by 1/255 and normalising with ``mean`` / ``std``."""
    from transformers import ViTImageProcessor

    hf = hf_config_of(config, decoder, mask_ratio)  # first: it refuses what ViTMAE cannot hold
    height, width = (hf["image_size"],) * 2 if isinstance(hf["image_size"], int) else hf["image_size"]
    if num_labels is not None:
        hf, tensors = hf_classifier_config(config, num_labels), hf_classifier_state_dict(state_dict)
    else:
        tensors = to_hf_state_dict(state_dict) if decoder else hf_encoder_state_dict(state_dict)
    tensors = {k: v.detach().cpu().contiguous() for k, v in tensors.items()}
    save_file(tensors, folder / "model.safetensors", metadata={"format": "pt"})
    (folder / "config.json").write_text(json.dumps(hf, indent=2) + "\n")
    processor = ViTImageProcessor(
        do_resize=True,
        size={"height": height, "width": width},
        resample=3,  # PIL's bicubic, as our evaluation view
        do_rescale=True,
        rescale_factor=1 / 255,
        do_normalize=True,
        image_mean=list(mean),
        image_std=list(std),
    )
    processor.save_pretrained(str(folder))


FOLDER_FORMAT = CheckpointFormat(
    name="Hugging Face folder (ViTMAEForPreTraining, ViTMAEModel, ViTModel; mae export --to huggingface)",
    format="huggingface",
    looks_for="a folder with model.safetensors or pytorch_model.bin and a config.json of model_type vit_mae "
    "or vit",
    detect=detect_folder,
    read=read_folder,
)
FILE_FORMAT = CheckpointFormat(
    name="Hugging Face weights file",
    format="huggingface",
    looks_for="a plain state dict in Hugging Face names (vit., embeddings., ...), config.json beside it",
    detect=detect_file,
    read=read_file,
)
