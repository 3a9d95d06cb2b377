"""The decoder's switches, each off by default: their names, allowed values and checks (the classes that
implement them: ``mae.models.decoder_variants``).

``decoder_type`` picks the paper's self-attention decoder or CrossMAE's cross-attention one;
``decoder_keep_ratio`` (checked in ``mae.models.masking``) reconstructs a fraction of the masked
patches; ``decoder_encoder_layers`` lets each cross-decoder block read another encoder layer.
"""

from typing import Literal, get_args

from mae.errors import ConfigError

DecoderType = Literal["self", "cross"]
DECODER_TYPES: tuple[str, ...] = get_args(DecoderType)
# The ``MaskedAutoencoderViT`` arguments that switch the decoder, with the paper's values (what a
# checkpoint written before them holds).
DECODER_SWITCHES = {"decoder_type": "self", "decoder_keep_ratio": 1.0, "decoder_encoder_layers": None}


def check_decoder_type(decoder_type: str, name: str = "decoder_type") -> None:
    """Raise ``ValueError`` naming the setting (``name``) when ``decoder_type`` is not in
    ``DECODER_TYPES``."""
    if decoder_type not in DECODER_TYPES:
        raise ConfigError(f"{name} {decoder_type!r} is unknown; expected one of {DECODER_TYPES}")


def check_decoder_encoder_layers(
    decoder_type: str, layers: list[int] | None, depth: int, decoder_depth: int
) -> list[int] | None:
    """``decoder_encoder_layers`` checked and made non-negative (None stays None).

    Raises:
        ValueError: naming the key: layers without the cross decoder, not one per decoder block, an
            encoder layer that does not exist, or no block reading the last layer.
    """
    if layers is None:
        return None
    if decoder_type != "cross":
        raise ConfigError(
            f"decoder_encoder_layers {layers} needs decoder_type 'cross' (got {decoder_type!r}): the "
            f"self-attention decoder reads the encoder's output only; set decoder_encoder_layers to null"
        )
    if not isinstance(layers, list | tuple) or len(layers) != decoder_depth:
        raise ConfigError(
            f"decoder_encoder_layers must list one encoder layer per decoder block ({decoder_depth}), got "
            f"{layers!r}"
        )
    for layer in layers:
        if isinstance(layer, bool) or not isinstance(layer, int) or not -depth <= layer < depth:
            raise ConfigError(
                f"decoder_encoder_layers {list(layers)} names encoder layer {layer!r}, which does not exist: "
                f"the encoder has {depth} blocks, so allowed values are 0..{depth - 1} (or -{depth}..-1 from "
                "the end)"
            )
    resolved = [layer % depth for layer in layers]
    if depth - 1 not in resolved:
        raise ConfigError(
            f"decoder_encoder_layers {list(layers)} never reads the last encoder layer ({depth - 1} or -1), "
            f"so the encoder blocks after layer {max(resolved)} would get no training signal; include it"
        )
    return resolved


# What each switch may be, for messages.
SWITCH_VALUES = {
    "decoder_type": " or ".join(map(repr, DECODER_TYPES)),
    "decoder_keep_ratio": "a number in (0, 1]",
    "decoder_encoder_layers": "null or one encoder layer per decoder block",
}


def switch_differences(
    saved: dict, wanted: dict, keys: tuple[str, ...] = tuple(DECODER_SWITCHES)
) -> list[str]:
    """The ``keys`` on which two ``MaskedAutoencoderViT`` configs differ (a key a config lacks has the
    paper's value, as in checkpoints written before the switches), one line each: the key, the
    saved and the wanted value, and the allowed values."""
    lines = []
    for key in keys:
        was, want = saved.get(key, DECODER_SWITCHES[key]), wanted.get(key, DECODER_SWITCHES[key])
        if was != want:
            lines.append(
                f"{key} is {was!r} in the checkpoint but {want!r} here (allowed: {SWITCH_VALUES[key]})"
            )
    return lines
