"""The encoder as timm's hub folder: ``config.json`` (``architecture``, ``num_classes``, ``model_args``,
``pretrained_cfg``) and ``model.safetensors``, written by timm's own ``save_for_hf``, so that
``timm.create_model("local-dir:FOLDER", pretrained=True)`` (or ``hf-hub:USER/REPO`` once uploaded)
builds it, and ``timm.data.resolve_data_config`` + ``create_transform`` prepare images as our
evaluation view does (resize the short side to ``size / crop_pct``, bicubic, centre crop, normalise).
"""

from pathlib import Path
from typing import Any

import timm
from timm.models import save_for_hf

from mae.convert.backbone import vit_args
from mae.convert.export import timm_architecture
from mae.convert.sources import MAECheckpoint, check_finite
from mae.errors import ConfigError


def timm_model_args(config: dict[str, Any]) -> dict[str, Any]:
    """The ``timm.create_model`` arguments of the encoder of an MAE ``config``: a backbone (no head)."""
    args = vit_args(config)
    return {**args, "img_size": list(args["img_size"]), "num_classes": 0}


def check_timm_representable(ckpt: MAECheckpoint) -> None:
    """Refuse an encoder a timm ``VisionTransformer`` would compute differently.

    Raises:
        ConfigError: a LayerNorm eps other than timm's 1e-6, naming the value.
    """
    eps = ckpt.config["layer_norm_eps"]
    if eps != 1e-6:
        raise ConfigError(
            f"{ckpt.source} uses LayerNorm eps {eps:g}; a timm ViT uses 1e-6, so its features would "
            "differ: export it with --to huggingface (which records eps), or use mae.load_backbone"
        )


def write_timm_folder(
    ckpt: MAECheckpoint, folder: Path, data_config: dict[str, Any], license: str | None
) -> None:
    """Write the encoder of ``ckpt`` into ``folder`` (an empty, new folder) in timm's hub layout.

    ``data_config``: timm's preprocessing keys (``input_size`` (C, H, W), ``mean``, ``std``,
    ``interpolation``, ``crop_pct``, ``crop_mode``), stored in ``pretrained_cfg`` with the ``license``
    (in place of those of the timm model whose name builds it).
    """
    check_timm_representable(ckpt)
    args = timm_model_args(ckpt.config)
    model = timm.create_model(timm_architecture(ckpt.config), pretrained=False, **args)
    state = ckpt.encoder_state_dict()
    check_finite(state, ckpt.source)
    model.load_state_dict(state, strict=True)
    own = {"pretrained_cfg": {"tag": "mae", "license": license}}
    save_for_hf(model, str(folder), own, args, safe_serialization=True, data_config=data_config)
