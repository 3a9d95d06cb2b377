"""The decoder's switches (``mae.models.decoder_switches``): bad values named with the allowed ones, the
paper's class refusing a variant's switches, and the differences between a checkpoint's switches and a
run's, one line each."""

import pytest

from mae.models import MaskedAutoencoderViT, build_mae
from mae.models.decoder_switches import DECODER_SWITCHES, check_decoder_encoder_layers, switch_differences
from mae.models.decoder_variants import CrossMAE
from tests.helpers import TINY


@pytest.mark.parametrize(
    "kwargs, message",
    [
        (dict(decoder_type="crosss"), "decoder_type 'crosss' is unknown; expected one of ('self', 'cross')"),
        (dict(decoder_keep_ratio=0.0), "decoder_keep_ratio must be a number in (0, 1]"),
        (dict(decoder_keep_ratio=-0.5), "decoder_keep_ratio must be a number in (0, 1]"),
        (dict(decoder_keep_ratio=1.5), "decoder_keep_ratio must be a number in (0, 1]"),
        (dict(decoder_keep_ratio="half"), "decoder_keep_ratio must be a number in (0, 1]"),
        (
            dict(decoder_type="cross", decoder_encoder_layers=[0, 5]),
            "names encoder layer 5, which does not exist: the encoder has 2 blocks, so allowed values are "
            "0..1",
        ),
        (
            dict(decoder_type="cross", decoder_encoder_layers=[-3, 1]),
            "names encoder layer -3, which does not exist",
        ),
        (dict(decoder_type="cross", decoder_encoder_layers=[1]), "one encoder layer per decoder block (2)"),
        (dict(decoder_type="cross", decoder_encoder_layers=[0, 0]), "never reads the last encoder layer"),
        (dict(decoder_encoder_layers=[0, 1]), "decoder_encoder_layers [0, 1] needs decoder_type 'cross'"),
    ],
)
def test_switches__bad_values_are_named_with_the_allowed_ones(kwargs, message):
    for build in (build_mae, MaskedAutoencoderViT):  # the values are checked before the class is
        with pytest.raises(ValueError) as error:
            build(**TINY, **kwargs)
        assert message in str(error.value)


def test_switches__the_paper_s_class_refuses_a_variant_s_switches_naming_the_factory():
    with pytest.raises(
        ValueError, match="MaskedAutoencoderViT does not implement decoder_type 'cross' .*build_mae"
    ):
        MaskedAutoencoderViT(**TINY, decoder_type="cross")
    with pytest.raises(ValueError, match="CrossMAE does not implement decoder_type 'self'"):
        CrossMAE(**TINY)


def test_switch_differences__one_line_per_key_a_missing_key_has_the_paper_s_value():
    assert switch_differences({}, dict(DECODER_SWITCHES)) == []  # a checkpoint from before the switches
    lines = switch_differences({"decoder_keep_ratio": 0.5}, {"decoder_type": "cross"})
    assert lines == [
        "decoder_type is 'self' in the checkpoint but 'cross' here (allowed: 'self' or 'cross')",
        "decoder_keep_ratio is 0.5 in the checkpoint but 1.0 here (allowed: a number in (0, 1])",
    ]
    assert switch_differences({"decoder_type": "cross"}, {}, keys=("decoder_keep_ratio",)) == []


def test_check_decoder_encoder_layers__counts_negative_layers_from_the_end():
    assert check_decoder_encoder_layers("cross", None, depth=4, decoder_depth=2) is None
    assert check_decoder_encoder_layers("cross", [-4, -1], depth=4, decoder_depth=2) == [0, 3]
    with pytest.raises(ValueError, match="names encoder layer True, which does not exist"):
        check_decoder_encoder_layers("cross", [True, 3], depth=4, decoder_depth=2)
