"""Named model sizes. Official names and sizes from the MAE repository (``models_mae.py``);
tiny/small follow DeiT's widths; the 32x32 variant is a CIFAR-size benchmark config."""

import inspect
from collections.abc import Callable
from typing import Any

from mae.errors import ConfigError
from mae.models.decoder_switches import DECODER_SWITCHES
from mae.models.decoder_variants import decoder_class
from mae.models.mae import MaskedAutoencoderViT

MODEL_REGISTRY: dict[str, Callable[..., MaskedAutoencoderViT]] = {}


def register_model(fn: Callable[..., MaskedAutoencoderViT]) -> Callable[..., MaskedAutoencoderViT]:
    MODEL_REGISTRY[fn.__name__] = fn
    return fn


def build_mae(**arguments: Any) -> MaskedAutoencoderViT:
    """A ``MaskedAutoencoderViT`` from its constructor arguments (a checkpoint's ``config``), of the class its
    decoder switches name: the paper's, or a decoder variant of ``mae.models.decoder_variants``."""
    switches = {**DECODER_SWITCHES, **arguments}
    return decoder_class(switches["decoder_type"], switches["decoder_keep_ratio"])(**arguments)


def _build(defaults: dict[str, Any], overrides: dict[str, Any]) -> MaskedAutoencoderViT:
    return build_mae(**{**defaults, **overrides})


_DECODER_512D8B = dict(decoder_embed_dim=512, decoder_depth=8, decoder_num_heads=16)


@register_model
def mae_vit_tiny_patch16(**kwargs: Any) -> MaskedAutoencoderViT:
    return _build(dict(patch_size=16, embed_dim=192, depth=12, num_heads=3, **_DECODER_512D8B), kwargs)


@register_model
def mae_vit_small_patch16(**kwargs: Any) -> MaskedAutoencoderViT:
    return _build(dict(patch_size=16, embed_dim=384, depth=12, num_heads=6, **_DECODER_512D8B), kwargs)


@register_model
def mae_vit_base_patch16(**kwargs: Any) -> MaskedAutoencoderViT:
    return _build(dict(patch_size=16, embed_dim=768, depth=12, num_heads=12, **_DECODER_512D8B), kwargs)


@register_model
def mae_vit_large_patch16(**kwargs: Any) -> MaskedAutoencoderViT:
    return _build(dict(patch_size=16, embed_dim=1024, depth=24, num_heads=16, **_DECODER_512D8B), kwargs)


@register_model
def mae_vit_huge_patch14(**kwargs: Any) -> MaskedAutoencoderViT:
    return _build(dict(patch_size=14, embed_dim=1280, depth=32, num_heads=16, **_DECODER_512D8B), kwargs)


@register_model
def mae_vit_tiny_patch4(**kwargs: Any) -> MaskedAutoencoderViT:
    """ViT-Tiny for 32x32 inputs (CIFAR): 8x8 patches of 4 px, a 128-d 4-block decoder."""
    defaults = dict(img_size=32, patch_size=4, embed_dim=192, depth=12, num_heads=3)
    return _build({**defaults, "decoder_embed_dim": 128, "decoder_depth": 4, "decoder_num_heads": 4}, kwargs)


# The official repository's names for the same three models.
MODEL_REGISTRY["mae_vit_base_patch16_dec512d8b"] = mae_vit_base_patch16
MODEL_REGISTRY["mae_vit_large_patch16_dec512d8b"] = mae_vit_large_patch16
MODEL_REGISTRY["mae_vit_huge_patch14_dec512d8b"] = mae_vit_huge_patch14

MODEL_ARGS: tuple[str, ...] = tuple(inspect.signature(MaskedAutoencoderViT.__init__).parameters)[1:]


def create_model(name: str, **overrides: Any) -> MaskedAutoencoderViT:
    """Build a named model, with any ``MaskedAutoencoderViT`` argument overridden; the decoder switches
    (``decoder_type``, ``decoder_keep_ratio``, ``decoder_encoder_layers``) choose its class (``build_mae``).

    Raises:
        ValueError: unknown name or override key (the message lists the valid ones).
    """
    if name not in MODEL_REGISTRY:
        raise ConfigError(f"unknown model {name!r}; valid names: {', '.join(sorted(MODEL_REGISTRY))}")
    unknown = sorted(set(overrides) - set(MODEL_ARGS))
    if unknown:
        raise ConfigError(
            f"unknown model argument(s) {unknown} for {name}; valid arguments: {', '.join(MODEL_ARGS)}"
        )
    return MODEL_REGISTRY[name](**overrides)
