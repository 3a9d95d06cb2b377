"""Named models of both families. The ViT's sizes: official names and sizes from the MAE repository
(``models_mae.py``); tiny/small follow DeiT's widths; the 32x32 variant is a CIFAR-size benchmark config.
The CNN's (``mae.models.cnn``): ``spark`` and ``fcmae``, the two papers' decoders with their papers'
encoder, mask cell and decoder width, any timm CNN through ``encoder``.

A model's ``config`` (what checkpoints record) names its family under ``family`` ("cnn"; absent for the
ViT, as 0.4.0 and the official MAE record it): ``build_model`` rebuilds either from it."""

import inspect
from collections.abc import Callable
from typing import Any

from mae.errors import ConfigError
from mae.models.cnn import MaskedAutoencoderCNN
from mae.models.decoder_switches import DECODER_SWITCHES
from mae.models.decoder_variants import decoder_class
from mae.models.mae import MaskedAutoencoderViT

MaskedAutoencoder = MaskedAutoencoderViT | MaskedAutoencoderCNN
MODEL_REGISTRY: dict[str, Callable[..., MaskedAutoencoder]] = {}
# The class each named model builds, whose constructor arguments ``create_model`` takes as overrides.
MODEL_CLASSES: dict[str, type[MaskedAutoencoder]] = {}


def register_model(
    fn: Callable[..., MaskedAutoencoder], model_class: type[MaskedAutoencoder] = MaskedAutoencoderViT
) -> Callable[..., MaskedAutoencoder]:
    MODEL_REGISTRY[fn.__name__] = fn
    MODEL_CLASSES[fn.__name__] = model_class
    return fn


def register_cnn_model(fn: Callable[..., MaskedAutoencoderCNN]) -> Callable[..., MaskedAutoencoderCNN]:
    return register_model(fn, MaskedAutoencoderCNN)


def build_model(**config: Any) -> MaskedAutoencoder:
    """The model a checkpoint's ``config`` describes, of its family: ``MaskedAutoencoderCNN`` for
    ``family="cnn"``, else the ViT (``build_mae``)."""
    family = config.pop("family", "vit")
    if family == MaskedAutoencoderCNN.family:
        return MaskedAutoencoderCNN(**config)
    if family != "vit":
        raise ConfigError(f"a model config's family must be vit or cnn; got {family!r}")
    return build_mae(**config)


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


@register_cnn_model
def spark(**kwargs: Any) -> MaskedAutoencoderCNN:
    """SparK (Tian et al., 2023): ResNet-50, its light hierarchical decoder of width 768, 32-px mask cells;
    any timm CNN through ``encoder``."""
    return MaskedAutoencoderCNN(**{**dict(encoder="resnet50", decoder="spark", decoder_width=768), **kwargs})


@register_cnn_model
def fcmae(**kwargs: Any) -> MaskedAutoencoderCNN:
    """ConvNeXt-V2's FCMAE (Woo et al., 2023): ConvNeXt-V2-Base, one decoder block of width 512, 32-px mask
    cells; any timm CNN through ``encoder``."""
    defaults = dict(encoder="convnextv2_base", decoder="fcmae", decoder_width=512, decoder_depth=1)
    return MaskedAutoencoderCNN(**{**defaults, **kwargs})


# The official repository's names for the same three models.
for _alias, _size in (
    ("mae_vit_base_patch16_dec512d8b", mae_vit_base_patch16),
    ("mae_vit_large_patch16_dec512d8b", mae_vit_large_patch16),
    ("mae_vit_huge_patch14_dec512d8b", mae_vit_huge_patch14),
):
    MODEL_REGISTRY[_alias] = _size
    MODEL_CLASSES[_alias] = MaskedAutoencoderViT


def model_args(model_class: type[MaskedAutoencoder]) -> tuple[str, ...]:
    """The constructor arguments of a model class."""
    return tuple(inspect.signature(model_class.__init__).parameters)[1:]


MODEL_ARGS: tuple[str, ...] = model_args(MaskedAutoencoderViT)  # the ViT's, as 0.4.0 named them


def create_model(name: str, **overrides: Any) -> MaskedAutoencoder:
    """Build a named model, with any argument of its class overridden. A ViT's decoder switches
    (``decoder_type``, ``decoder_keep_ratio``, ``decoder_encoder_layers``) choose its class (``build_mae``).

    Raises:
        ValueError: unknown name or override key (the message lists the valid ones).
    """
    if name not in MODEL_REGISTRY:
        raise ConfigError(f"unknown model {name!r}; valid names: {', '.join(sorted(MODEL_REGISTRY))}")
    valid = model_args(MODEL_CLASSES[name])
    unknown = sorted(set(overrides) - set(valid))
    if unknown:
        raise ConfigError(
            f"unknown model argument(s) {unknown} for {name}; valid arguments: {', '.join(valid)}"
        )
    return MODEL_REGISTRY[name](**overrides)
