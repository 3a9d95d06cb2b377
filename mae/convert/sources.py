"""Reading every MAE checkpoint format people have into one layout: the official MAE / timm names.

Formats (auto-detected from the file's structure, or named explicitly):

- ``lightning``: our checkpoints (``mae pretrain``, ``mae finetune``): the architecture is read from the
  record of ``mae.convert.architecture``; files written before it (version 0.1) from the module's
  hyperparameters or the fine-tuning module's encoder config.
- ``official``: files of the official MAE code, ``{"model": state_dict, ["optimizer", "epoch", "args"]}``,
  full (with decoder) or encoder-only, pretrained or fine-tuned.
- ``timm``: a timm ``VisionTransformer`` state dict (``.pth`` / ``.bin`` / ``.safetensors``), including
  our exported encoders (with their ``.json`` beside them).
- ``huggingface``: a ``ViTMAEForPreTraining`` / ``ViTMAEModel`` / ``ViTModel`` folder or weights file
  with its ``config.json``.
"""

import inspect
import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from mae.convert.architecture import ARCHITECTURE_KEY, DATA_KEY, encoder_config
from mae.convert.huggingface import from_hf_state_dict
from mae.convert.report import block_count
from mae.convert.safe_load import read_safetensors, safe_torch_load
from mae.convert.sharded_checkpoint import is_sharded_checkpoint, read_sharded_checkpoint
from mae.errors import InputError, MissingFileError
from mae.models.factory import MODEL_REGISTRY, create_model
from mae.models.mae import MaskedAutoencoderViT

FORMATS = ("auto", "lightning", "official", "timm", "huggingface")
_HF_PREFIXES = ("vit.", "embeddings.", "encoder.layer", "layers.", "layernorm.", "decoder.decoder_")
_HF_IGNORED = ("pooler.", "classifier.", "vit.pooler.")
# Standard ViT widths -> heads (64-d heads, except ViT-H: 16 heads of 80).
_HEADS_BY_WIDTH = {192: 3, 384: 6, 768: 12, 1024: 16, 1280: 16}


@dataclass
class MAECheckpoint:
    """A checkpoint in the official MAE layout, with the architecture it needs.

    Attributes:
        state_dict: official MAE keys (encoder keys are timm ``VisionTransformer`` keys).
        config: ``MaskedAutoencoderViT`` arguments (decoder ones only meaningful with a decoder).
        format: the detected or given format.
        notes: assumptions made where the file did not say (e.g. the number of heads).
        ignored: source tensors with no place in an MAE / ViT (e.g. a Hugging Face pooler).
        data: the ``mae_data`` record of our checkpoints (``mae.convert.architecture``), else None.
    """

    source: str
    format: str
    state_dict: dict[str, torch.Tensor]
    config: dict[str, Any]
    notes: list[str] = field(default_factory=list)
    ignored: list[str] = field(default_factory=list)
    data: dict[str, Any] | None = None  # how the training run normalised images (``mae_data``), when known

    @property
    def has_decoder(self) -> bool:
        return "decoder_embed.weight" in self.state_dict

    def encoder_state_dict(self) -> dict[str, torch.Tensor]:
        """The timm ``VisionTransformer`` part: everything but ``mask_token`` and ``decoder_*``."""
        return {
            k: v for k, v in self.state_dict.items() if not (k.startswith("decoder") or k == "mask_token")
        }


def check_finite(state: dict[str, torch.Tensor], source: str | Path) -> None:
    """Refuse weights that hold a NaN or an infinity (a diverged run's checkpoint): every output of the
    model would be NaN without a word (NaN embeddings, a reconstruction figure of loss nan).

    Raises:
        ValueError: naming ``source``, the first bad tensor and how many of its values are bad.
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


def read_checkpoint(source: str | Path, format: str = "auto") -> MAECheckpoint:
    """Read ``source`` (file or Hugging Face folder) as untrusted input; see the module doc for formats.

    Raises:
        FileNotFoundError, ValueError: with the path, what was found and what was expected.
    """
    if format not in FORMATS:
        raise InputError(f"checkpoint format {format!r} is unknown; expected one of {FORMATS}")
    path = Path(source)
    if is_sharded_checkpoint(path):  # a sharded training run's checkpoint: its weights, consolidated
        return _read_lightning(path, read_sharded_checkpoint(path, model_only=True))
    if path.is_dir():
        timm_config = timm_folder_config(path)
        if timm_config is not None:
            return _read_timm_folder(path, timm_config, _hf_weights_in(path))
        return _read_huggingface(path, _hf_weights_in(path))
    if path.suffix == ".safetensors":
        tensors = read_safetensors(path)
        if format == "huggingface" or (format == "auto" and _looks_like_hf(tensors)):
            return _read_huggingface(path.parent, tensors, path)
        return _read_timm(path, tensors)

    obj = safe_torch_load(path)
    if not isinstance(obj, dict):
        raise InputError(f"{path} holds a {type(obj).__name__}, not a checkpoint dict or state dict")
    if format == "auto":
        if "state_dict" in obj and "pytorch-lightning_version" in obj:
            format = "lightning"
        elif isinstance(obj.get("model"), dict):
            format = "official"
        elif all(isinstance(v, torch.Tensor) for v in obj.values()):
            format = "huggingface" if _looks_like_hf(obj) else "timm"
        else:
            raise InputError(
                f"cannot tell the format of {path}: top-level keys {sorted(obj)[:8]}; expected a Lightning "
                f"checkpoint ('state_dict'), an official MAE file ('model') or a plain state dict; "
                f"name the format explicitly with format= (Python) or --checkpoint-format (commands)"
            )
    if format == "lightning":
        return _read_lightning(path, obj)
    if format == "official":
        return _read_official(path, obj)
    if format == "huggingface":
        return _read_huggingface(path.parent, obj, path)
    return _read_timm(path, obj)


def _looks_like_hf(tensors: dict[str, torch.Tensor]) -> bool:
    return any(k.startswith(_HF_PREFIXES) for k in tensors) and "patch_embed.proj.weight" not in tensors


def _hf_weights_in(folder: Path) -> dict[str, torch.Tensor]:
    if (folder / "model.safetensors").is_file():
        return read_safetensors(folder / "model.safetensors")
    if (folder / "pytorch_model.bin").is_file():
        return safe_torch_load(folder / "pytorch_model.bin")
    raise MissingFileError(
        f"{folder} holds neither model.safetensors nor pytorch_model.bin (a Hugging Face folder)"
    )


def _read_lightning(path: Path, obj: dict) -> MAECheckpoint:
    record = obj.get(ARCHITECTURE_KEY)
    if record is None:
        return _read_lightning_v0_1(path, obj)
    prefix = record.get("state_dict_prefix", "model.")
    state = {k[len(prefix) :]: v for k, v in obj["state_dict"].items() if k.startswith(prefix)}
    if not state:
        raise InputError(
            f"{path}: its {ARCHITECTURE_KEY} record says the weights are under {prefix!r}, but none are"
        )
    config = encoder_config(record, str(path))
    check_record(config, state, path)
    return MAECheckpoint(str(path), "lightning", state, config, data=obj.get(DATA_KEY))


# The record's arguments that the tensors fix, and how to read them off the tensors (``infer_config``).
_SHAPE_ARGS = ("patch_size", "in_chans", "embed_dim", "depth", "mlp_ratio")
_DECODER_SHAPE_ARGS = ("decoder_embed_dim", "decoder_depth")


def check_record(config: dict[str, Any], state: dict[str, torch.Tensor], path: str | Path) -> None:
    """A checkpoint's architecture record against its own tensors, before any model is built from it
    (a damaged or edited record would otherwise build, say, a 2**20-wide model: terabytes).

    Raises:
        ValueError: naming ``path``: an argument ``MaskedAutoencoderViT`` does not take, a value of the
            wrong type, or an argument that disagrees with the tensors' shapes (both values given).
    """
    _check_record_types(config, path)
    measured, _ = infer_config(
        state, {"img_size": config.get("img_size"), "num_heads": 1, "decoder_num_heads": 1}, path
    )
    _check_record_shapes(config, measured, state, path)
    _check_record_grid(config.get("img_size"), measured["patch_size"], state["pos_embed"].shape[1] - 1, path)
    for heads, width_key in (("num_heads", "embed_dim"), ("decoder_num_heads", "decoder_embed_dim")):
        if heads in config and width_key in config and config[width_key] % config[heads]:
            raise InputError(
                f"{path}: its {ARCHITECTURE_KEY} record has {heads}={config[heads]}, which does not divide "
                f"{width_key}={config[width_key]}"
            )


def _image_sizes(size: Any) -> list:
    """A record's ``img_size`` as a list of one (H) or two (H, W) entries, unchecked."""
    return list(size) if isinstance(size, list | tuple) else [size]


def _check_record_types(config: dict[str, Any], path: str | Path) -> None:
    """Every argument one ``MaskedAutoencoderViT`` takes; sizes and counts positive integers."""
    known = set(inspect.signature(MaskedAutoencoderViT.__init__).parameters) - {"self"}
    unknown = sorted(set(config) - known)
    if unknown:
        raise InputError(
            f"{path}: its {ARCHITECTURE_KEY} record has arguments MaskedAutoencoderViT does not take: "
            f"{unknown} (it takes {sorted(known)}); the record is damaged or from another program"
        )
    for key in (
        "patch_size",
        "in_chans",
        "embed_dim",
        "depth",
        "num_heads",
        "decoder_embed_dim",
        "decoder_depth",
        "decoder_num_heads",
    ):
        value = config.get(key)
        if value is not None and (not isinstance(value, int) or isinstance(value, bool) or value < 1):
            raise InputError(
                f"{path}: its {ARCHITECTURE_KEY} record has {key}={value!r}; expected a positive integer"
            )
    size = config.get("img_size")
    sizes = _image_sizes(size)
    if len(sizes) not in (1, 2) or not all(
        isinstance(v, int) and not isinstance(v, bool) and v >= 1 for v in sizes
    ):
        raise InputError(
            f"{path}: its {ARCHITECTURE_KEY} record has img_size={size!r}; expected H or [H, W] pixels"
        )


def _check_record_shapes(
    config: dict[str, Any], measured: dict[str, Any], state: dict[str, torch.Tensor], path: str | Path
) -> None:
    """The record's widths, depths and decoder kind against those ``measured`` on the tensors."""
    keys = _SHAPE_ARGS + (_DECODER_SHAPE_ARGS if "decoder_embed.weight" in state else ())
    for key in keys:
        if key in config and not math.isclose(float(config[key]), float(measured[key])):
            raise InputError(
                f"{path}: its {ARCHITECTURE_KEY} record says {key}={config[key]!r}, but its tensors have "
                f"{key}={measured[key]!r}; the record is damaged or was edited"
            )
    if "decoder_embed.weight" in state and config.get("decoder_type", "self") != measured["decoder_type"]:
        raise InputError(
            f"{path}: its {ARCHITECTURE_KEY} record says "
            f"decoder_type={config.get('decoder_type', 'self')!r}, but its tensors are a "
            f"{measured['decoder_type']!r} decoder's; the record is damaged or was edited"
        )


def _check_record_grid(size: Any, patch: int, positions: int, path: str | Path) -> None:
    """The record's ``img_size`` cut into ``patch`` px patches gives the ``positions`` of ``pos_embed``."""
    sizes = _image_sizes(size)
    height, width = sizes * 2 if len(sizes) == 1 else sizes
    if height % patch or width % patch or (height // patch) * (width // patch) != positions:
        raise InputError(
            f"{path}: its {ARCHITECTURE_KEY} record says img_size={size!r}, but pos_embed holds {positions} "
            f"patch positions of {patch}x{patch} pixels; the record is damaged or was edited"
        )


# The pretraining module's own arguments that version 0.1 kept out of ``model_kwargs``.
_V0_1_PRETRAIN_ARGS = ("img_size", "norm_pix_loss", "mask_strategy")


def _read_lightning_v0_1(path: Path, obj: dict) -> MAECheckpoint:
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
    config, notes = None, []
    if hp.get("model") in MODEL_REGISTRY:
        kwargs = dict(hp.get("model_kwargs") or {})
        kwargs.update({key: hp[key] for key in _V0_1_PRETRAIN_ARGS if key in hp})
        with torch.device("meta"):
            config = create_model(hp["model"], **kwargs).config
    if config is None:
        config, notes = infer_config(state, source=path)
    return MAECheckpoint(str(path), "lightning", state, config, notes)


def _read_official(path: Path, obj: dict) -> MAECheckpoint:
    state = obj["model"]
    args = obj.get("args")
    hints: dict[str, Any] = {}
    if args is not None:
        name = getattr(args, "model", None)
        if name in MODEL_REGISTRY or f"mae_{name}" in MODEL_REGISTRY:
            with torch.device("meta"):
                factory = create_model(name if name in MODEL_REGISTRY else f"mae_{name}").config
            # Heads come from the named size only when the weights really are that size.
            if (
                "patch_embed.proj.weight" in state
                and state["patch_embed.proj.weight"].shape[0] == factory["embed_dim"]
            ):
                hints["num_heads"] = factory["num_heads"]
            if (
                "decoder_embed.weight" in state
                and state["decoder_embed.weight"].shape[0] == factory["decoder_embed_dim"]
            ):
                hints["decoder_num_heads"] = factory["decoder_num_heads"]
        if getattr(args, "input_size", None):
            hints["img_size"] = args.input_size
        if getattr(args, "norm_pix_loss", None) is not None:
            hints["norm_pix_loss"] = bool(args.norm_pix_loss)
    config, notes = infer_config(state, hints, path)
    return MAECheckpoint(str(path), "official", state, config, notes)


def _read_timm(path: Path, state: dict) -> MAECheckpoint:
    hints: dict[str, Any] = {}
    sidecar = path.with_suffix(".json")
    if sidecar.is_file():  # written by mae.export
        meta = json.loads(sidecar.read_text())
        args = meta.get("model_args", {})
        hints = {k: args[k] for k in ("img_size", "num_heads") if k in args}
        hints.update(
            {k: v for k, v in meta.get("mae", {}).items() if k in ("layer_norm_eps", "norm_pix_loss")}
        )
    config, notes = infer_config(state, hints, path)
    return MAECheckpoint(str(path), "timm", state, config, notes)


def timm_folder_config(folder: Path) -> dict | None:
    """The ``config.json`` of a timm hub folder (``architecture`` and ``pretrained_cfg``, as timm's
    ``save_for_hf`` and ``mae export --to timm`` write it), or None for any other folder."""
    try:
        config = json.loads((Path(folder) / "config.json").read_text())
    except (OSError, ValueError):
        return None
    is_timm = isinstance(config, dict) and "architecture" in config and "pretrained_cfg" in config
    return config if is_timm else None


def _read_timm_folder(folder: Path, config: dict, state: dict[str, torch.Tensor]) -> MAECheckpoint:
    """A timm hub folder: the weights' architecture from ``model_args``, the normalisation from
    ``pretrained_cfg`` (as ``mae_data``, so every command prepares images as the export recorded)."""
    args = config.get("model_args") or {}
    hints = {k: args[k] for k in ("img_size", "num_heads") if k in args}
    ckpt_config, notes = infer_config(state, hints, folder)
    pretrained = config["pretrained_cfg"] if isinstance(config["pretrained_cfg"], dict) else {}
    data = None
    if {"mean", "std", "input_size"} <= pretrained.keys():
        channels, *size = pretrained["input_size"]
        data = {
            "in_chans": channels,
            "img_size": list(size),
            "mean": list(pretrained["mean"]),
            "std": list(pretrained["std"]),
        }
    return MAECheckpoint(str(folder), "timm", state, ckpt_config, notes, data=data)


def _read_huggingface(
    folder: Path, tensors: dict[str, torch.Tensor], path: Path | None = None
) -> MAECheckpoint:
    config_file = folder / "config.json"
    if not config_file.is_file():
        raise MissingFileError(
            f"Hugging Face weights {path or folder} need their config.json beside them (not found in "
            f"{folder})"
        )
    hf = json.loads(config_file.read_text())
    if hf.get("hidden_act", "gelu") != "gelu":  # Hugging Face's "gelu" is the exact (erf) GELU of MAE
        raise InputError(
            f"{config_file}: hidden_act is {hf['hidden_act']!r}; MAE ViTs use exact GELU ('gelu'), so this "
            "model would compute something else here"
        )
    if not hf.get("qkv_bias", True):
        raise InputError(
            f"{config_file}: qkv_bias=false models are not MAE ViTs (MAE uses query/key/value biases)"
        )
    ignored = sorted(k for k in tensors if k.startswith(_HF_IGNORED))
    kept = {}
    for key, value in tensors.items():
        if key in ignored:
            continue
        kept[key if key.startswith(("vit.", "decoder.")) else f"vit.{key}"] = value  # ViTMAEModel / ViTModel
    state = from_hf_state_dict(kept)
    width = hf.get("hidden_size", 768)
    hints = {
        "img_size": hf.get("image_size", 224),
        "num_heads": hf.get("num_attention_heads"),
        "decoder_num_heads": hf.get("decoder_num_attention_heads"),
        "layer_norm_eps": hf.get("layer_norm_eps", 1e-12),
        "norm_pix_loss": bool(hf.get("norm_pix_loss", False)),
    }
    config, notes = infer_config(state, {k: v for k, v in hints.items() if v is not None}, path or folder)
    if config["layer_norm_eps"] != 1e-6:
        notes.append(
            f"layer_norm_eps={config['layer_norm_eps']:g} from config.json (the official MAE uses 1e-6); "
            "kept so outputs match the Hugging Face model"
        )
    if config["embed_dim"] != width:
        raise InputError(f"{config_file}: hidden_size {width} but the weights are {config['embed_dim']} wide")
    return MAECheckpoint(str(path or folder), "huggingface", state, config, notes, ignored)


def infer_config(
    state: dict[str, torch.Tensor], hints: dict[str, Any] | None = None, source: str | Path = "the state dict"
) -> tuple[dict, list[str]]:
    """``MaskedAutoencoderViT`` arguments from tensor shapes, with ``hints`` for what shapes cannot tell;
    ``source`` names the file in errors.

    Returns:
        (config, notes): notes say what was assumed (heads from the width, a square image).
    """
    hints = dict(hints or {})
    notes: list[str] = []
    if "patch_embed.proj.weight" not in state or "pos_embed" not in state:
        raise InputError(
            f"{source} is not a ViT / MAE state dict: no patch_embed.proj.weight or pos_embed (keys start "
            f"{sorted(state)[:5]})"
        )
    proj = state["patch_embed.proj.weight"]
    if proj.ndim != 4:
        raise InputError(
            f"{source}: patch_embed.proj.weight must be a conv weight (D, C, p, p), got shape "
            f"{tuple(proj.shape)}"
        )
    embed_dim, in_chans, patch_size = proj.shape[0], proj.shape[1], proj.shape[-1]
    depth = block_count(state, "blocks")
    mlp_ratio = state["blocks.0.mlp.fc1.weight"].shape[0] / embed_dim if depth else 4.0

    num_patches = state["pos_embed"].shape[1] - 1
    img_size = hints.get("img_size")
    if img_size is None:
        side = math.isqrt(num_patches)
        if side * side != num_patches:
            raise InputError(
                f"{source}: pos_embed has {num_patches} patch positions, not a square grid: pass "
                "img_size=(H, W)"
            )
        img_size = side * patch_size
        notes.append(f"img_size={img_size} from the {side}x{side} position grid")
    img_size = tuple(img_size) if isinstance(img_size, (list, tuple)) else (img_size, img_size)

    num_heads = hints.get("num_heads")
    if num_heads is None:
        num_heads = _HEADS_BY_WIDTH.get(embed_dim, max(1, embed_dim // 64))
        notes.append(
            f"num_heads={num_heads} assumed from width {embed_dim} (the file does not say); pass num_heads="
        )
    config = dict(
        img_size=img_size,
        patch_size=patch_size,
        in_chans=in_chans,
        embed_dim=embed_dim,
        depth=depth,
        num_heads=num_heads,
        mlp_ratio=mlp_ratio,
        norm_pix_loss=hints.get("norm_pix_loss", False),
        mask_strategy="random",
        layer_norm_eps=hints.get("layer_norm_eps", 1e-6),
        decoder_embed_dim=512,
        decoder_depth=8,
        decoder_num_heads=16,
    )
    if "decoder_embed.weight" in state:
        # A cross-attention decoder's blocks have query and key-value projections
        # (mae.models.cross_attention).
        config["decoder_type"] = "cross" if "decoder_blocks.0.attn.kv.weight" in state else "self"
        dec_dim = state["decoder_embed.weight"].shape[0]
        dec_heads = hints.get("decoder_num_heads")
        if dec_heads is None:
            dec_heads = 16 if dec_dim == 512 else max(1, dec_dim // 32)
            notes.append(f"decoder_num_heads={dec_heads} assumed from decoder width {dec_dim}")
        config.update(
            decoder_embed_dim=dec_dim,
            decoder_depth=block_count(state, "decoder_blocks"),
            decoder_num_heads=dec_heads,
        )
    return config, notes


# Where ``mae finetune --ema.decay`` keeps the EMA weights in its checkpoints: under
# ``checkpoint["callbacks"]["EMA"]`` (``mae.training.callbacks.ema``), named as the live weights are in
# ``MAECheckpoint.state_dict``.
EMA_WEIGHTS_KEY = "ema_state_dict"


def ema_checkpoint(ckpt: MAECheckpoint) -> MAECheckpoint:
    """``ckpt``, one of our Lightning checkpoints as ``read_checkpoint`` read it, with the EMA weights its run
    kept in place of the live weights.

    Raises:
        InputError: ``ckpt`` holds no EMA weights (not a run with ``--ema.decay``), or EMA weights whose names
            or shapes differ from the live weights'.
    """
    state = None
    if ckpt.format == "lightning":
        callbacks = safe_torch_load(Path(ckpt.source)).get("callbacks") or {}
        state = (callbacks.get("EMA") or {}).get(EMA_WEIGHTS_KEY)
    if not isinstance(state, dict):
        raise InputError(
            f"{ckpt.source} holds no EMA weights (only runs with --ema.decay keep them): export it "
            "without --ema"
        )
    shapes = {name: tuple(tensor.shape) for name, tensor in ckpt.state_dict.items()}
    if {name: tuple(tensor.shape) for name, tensor in state.items()} != shapes:
        raise InputError(
            f"{ckpt.source}: its EMA weights do not match its weights (names or shapes); the file is damaged "
            "or was edited"
        )
    return MAECheckpoint(ckpt.source, ckpt.format, state, ckpt.config, ckpt.notes, ckpt.ignored, ckpt.data)
