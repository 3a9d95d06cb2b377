"""The encoder of an MAE ``config`` in timm's terms: its ``VisionTransformer`` arguments (``vit_args``), a
registered timm model name that builds it (``timm_architecture``) and the arguments of a feature
backbone (``timm_model_args``), as exports and ``load_backbone`` build it."""

from typing import Any

import timm

# timm names of the standard widths/depths; any other shape is built from a base name plus model_args.
_TIMM_NAMES = {
    (192, 12): "vit_tiny",
    (384, 12): "vit_small",
    (768, 12): "vit_base",
    (1024, 24): "vit_large",
    (1280, 32): "vit_huge",
}


def vit_args(config: dict[str, Any]) -> dict[str, Any]:
    """timm ``VisionTransformer`` arguments of the encoder described by an MAE ``config``."""
    return dict(
        img_size=tuple(config["img_size"]),
        patch_size=config["patch_size"],
        in_chans=config["in_chans"],
        embed_dim=config["embed_dim"],
        depth=config["depth"],
        num_heads=config["num_heads"],
        mlp_ratio=config["mlp_ratio"],
        qkv_bias=True,
        class_token=True,
    )


def timm_model_args(config: dict[str, Any]) -> dict[str, Any]:
    """The ``timm.create_model`` arguments of the encoder of an MAE ``config``: a backbone (no head), the
    image size as a list (JSON)."""
    args = vit_args(config)
    return {**args, "img_size": list(args["img_size"]), "num_classes": 0}


def timm_architecture(config: dict[str, Any]) -> str:
    """A registered timm model name for the encoder (``model_args`` still set every dimension)."""
    size = _TIMM_NAMES.get((config["embed_dim"], config["depth"]), "vit_base")
    name = f"{size}_patch{config['patch_size']}_224"
    return name if name in timm.list_models(name) else "vit_base_patch16_224"
