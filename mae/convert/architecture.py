"""The checkpoint contract: every checkpoint we write records the architecture it holds.

A checkpoint written by ``mae pretrain`` or ``mae finetune`` has, next to Lightning's own keys::

    checkpoint["mae_architecture"] = {
        "class": "MaskedAutoencoderViT" | "VisionTransformer",
        "args": {...},            # the constructor's keyword arguments (JSON types: tuples as lists)
        "layer_norm_eps": 1e-6,   # VisionTransformer only: eps of its LayerNorms (not an argument)
        "state_dict_prefix": "model." | "vit.",  # where the module's tensors sit in "state_dict"
    }

and, when the run's data module says how it normalises images (every one of ours does)::

    checkpoint["mae_data"] = {"in_chans": 3, "img_size": [224, 224], "mean": [...], "std": [...]}

so that tools given only the checkpoint (``mae reconstruct``, the demo page) prepare
images exactly as training did.

``MaskedAutoencoderViT`` args are its ``config``; ``VisionTransformer`` args are timm's (a linear-probe
classifier's head is a BatchNorm + linear, recorded as ``"head": "batchnorm_linear"``). Readers
rebuild the model from this record alone; checkpoints written before the contract (version 0.1)
are read through ``mae.convert.sources``' older path.
"""

from typing import Any

from mae.errors import ConfigError

ARCHITECTURE_KEY = "mae_architecture"
DATA_KEY = "mae_data"
MAE_CLASS = "MaskedAutoencoderViT"
VIT_CLASS = "VisionTransformer"

# VisionTransformer arguments that describe the encoder's weights (the rest: head and regularisation).
_ENCODER_VIT_ARGS = ("img_size", "patch_size", "in_chans", "embed_dim", "depth", "num_heads", "mlp_ratio")


def _jsonable(args: dict[str, Any]) -> dict[str, Any]:
    return {k: list(v) if isinstance(v, tuple) else v for k, v in args.items()}


def mae_record(config: dict[str, Any], prefix: str = "model.") -> dict[str, Any]:
    """The record of a ``MaskedAutoencoderViT`` with constructor arguments ``config``."""
    return {"class": MAE_CLASS, "args": _jsonable(config), "state_dict_prefix": prefix}


def vit_record(vit_args: dict[str, Any], layer_norm_eps: float, prefix: str = "vit.") -> dict[str, Any]:
    """The record of a timm ``VisionTransformer`` built with ``vit_args``."""
    return {
        "class": VIT_CLASS,
        "args": _jsonable(vit_args),
        "layer_norm_eps": layer_norm_eps,
        "state_dict_prefix": prefix,
    }


def encoder_config(record: dict[str, Any], source: str) -> dict[str, Any]:
    """``MaskedAutoencoderViT`` arguments of the model in ``record`` (for a classifier: its encoder;
    decoder arguments are then the defaults and unused).

    Raises:
        ValueError: a record of an unknown class or without the needed arguments, naming ``source``.
    """
    cls, args = record.get("class"), record.get("args") or {}
    if cls == MAE_CLASS:
        config = dict(args)
    elif cls == VIT_CLASS:
        missing = [k for k in _ENCODER_VIT_ARGS if k not in args]
        if missing:
            raise ConfigError(f"{source}: {ARCHITECTURE_KEY} lacks VisionTransformer arguments {missing}")
        config = {k: args[k] for k in _ENCODER_VIT_ARGS}
        config["layer_norm_eps"] = record.get("layer_norm_eps", 1e-6)
    else:
        raise ConfigError(
            f"{source}: {ARCHITECTURE_KEY} names class {cls!r}; expected {MAE_CLASS!r} or {VIT_CLASS!r}"
        )
    config["img_size"] = (
        tuple(config["img_size"]) if isinstance(config.get("img_size"), list) else config["img_size"]
    )
    return config


def data_record(datamodule: Any) -> dict[str, Any] | None:
    """The ``mae_data`` entry of a data module with ``mean`` / ``std`` (None for other data)."""
    if not all(hasattr(datamodule, k) for k in ("mean", "std", "in_chans", "img_size")):
        return None
    size = datamodule.img_size
    return {
        "in_chans": datamodule.in_chans,
        "img_size": [size, size] if isinstance(size, int) else list(size),
        "mean": list(datamodule.mean),
        "std": list(datamodule.std),
    }
