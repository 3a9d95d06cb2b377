"""The student of a distillation (``mae distill``): a plain timm ``VisionTransformer`` of any registered ViT
name, built without a head and initialised as TinyMIM initialises its students (the MAE encoder's
initialisation, with the fixed 2-D sin-cos position embeddings).

References: TinyMIM (Ren et al., CVPR 2023; OliverRensu/TinyMIM ``models_tinymim.py``): Xavier-uniform
linear layers and patch projection, normal(0.02) cls token, fixed sin-cos position embeddings, drop path
0.1.
"""

from typing import Any

import timm
import torch
from timm.models.vision_transformer import VisionTransformer
from torch import nn

from mae.errors import ConfigError
from mae.models.mae import init_linear_and_norm
from mae.models.pos_embed import sincos_2d


def create_student(
    name: str,
    img_size: int | tuple[int, int],
    in_chans: int,
    drop_path_rate: float = 0.1,
    **timm_kwargs: Any,
) -> VisionTransformer:
    """The timm ViT ``name`` (e.g. "vit_tiny_patch16_224") for (N, ``in_chans``, H, W) inputs of
    ``img_size``, without a head (``num_classes=0``, cls-token pooling), with ``timm_kwargs`` over its
    architecture (``patch_size``, ``embed_dim``, ``depth``, ``num_heads``, ...), freshly initialised
    (``initialize_student``).

    Raises:
        ConfigError: ``name`` is not a timm model, or not a ``VisionTransformer``, naming ``model.student``.
    """
    if not timm.is_model(name):
        raise ConfigError(
            f"model.student {name!r} is not a timm model name: e.g. vit_tiny_patch16_224, "
            "vit_small_patch16_224, vit_base_patch16_224 (timm.list_models('vit_*') lists them)"
        )
    not_a_vit = ConfigError(
        f"model.student {name!r} is not a timm VisionTransformer: choose a plain ViT, e.g. "
        "vit_tiny_patch16_224"
    )
    try:
        model = timm.create_model(
            name,
            pretrained=False,
            img_size=img_size,
            in_chans=in_chans,
            num_classes=0,
            global_pool="token",
            drop_path_rate=drop_path_rate,
            **timm_kwargs,
        )
    except TypeError as err:  # a model that takes no ViT arguments (a CNN), or an unknown model_kwargs key
        if not _is_vit_name(name):
            raise not_a_vit from err
        raise ConfigError(f"model.student_kwargs: {err}") from err
    if not isinstance(model, VisionTransformer):
        raise not_a_vit
    initialize_student(model)
    return model


def _is_vit_name(name: str) -> bool:
    """Whether timm builds ``name`` in its ``vision_transformer`` module."""
    return timm.models.is_model_in_modules(name.split(".")[0], ["vision_transformer"])


def initialize_student(vit: VisionTransformer) -> None:
    """MAE's initialisation of an encoder, in place: Xavier-uniform linear layers and patch projection (as a
    linear), zero biases, unit LayerNorms, normal(0.02) cls token, and the fixed 2-D sin-cos position
    embeddings of its patch grid, frozen (``requires_grad`` False: no optimizer step changes them)."""
    w = vit.patch_embed.proj.weight
    nn.init.xavier_uniform_(w.view(w.shape[0], -1))
    if vit.cls_token is not None:
        nn.init.normal_(vit.cls_token, std=0.02)
    vit.apply(init_linear_and_norm)
    if vit.pos_embed is not None and vit.num_prefix_tokens == 1 and not vit.no_embed_class:
        with torch.no_grad():
            table = sincos_2d(vit.embed_dim, tuple(vit.patch_embed.grid_size))
            vit.pos_embed.copy_(table.unsqueeze(0).to(vit.pos_embed))
        vit.pos_embed.requires_grad_(False)
