"""The one table of export targets (``mae.convert.exports.targets``) and the one way to choose one: ``--to``,
or ``--out``'s suffix as its shorthand (``x.onnx`` is ``--to onnx``); options of another target refused."""

from pathlib import Path

import pytest

from mae.convert.exports.targets import EXPORT_TARGETS, TARGET_OPTIONS, check_options, choose_target
from mae.errors import UsageError


def test_choose__the_suffix_is_shorthand_for_the_file_targets():
    assert (
        choose_target(None, "enc.onnx") is EXPORT_TARGETS["onnx"] is choose_target("onnx", Path("enc.onnx"))
    )
    assert choose_target(None, "enc.safetensors") is EXPORT_TARGETS["safetensors"]
    assert choose_target("timm", "folder") is EXPORT_TARGETS["timm"]
    assert sorted(EXPORT_TARGETS) == ["huggingface", "onnx", "safetensors", "timm"]


@pytest.mark.parametrize(
    ("to", "out", "message"),
    [
        (
            None,
            "enc.pt",
            "--out must end in .safetensors (a timm ViT) or .onnx (an ONNX file), got enc.pt; or",
        ),
        (None, "folder", "write a folder with --to timm or huggingface"),
        ("timm", "enc.onnx", "--to timm writes a folder: give --out a folder path, not enc.onnx"),
        ("onnx", "enc.safetensors", "--to onnx writes a .onnx file: give --out a path ending in it"),
        ("tflite", "enc.tflite", "--to must be one of safetensors, onnx, timm, huggingface, got 'tflite'"),
    ],
)
def test_choose__an_out_the_target_cannot_write_is_refused(to, out, message):
    with pytest.raises(UsageError, match=message.replace("(", r"\(").replace(")", r"\)").replace(".", r"\.")):
        choose_target(to, out)


def test_check_options__another_targets_options_are_refused_naming_both():
    check_options(EXPORT_TARGETS["onnx"], {**TARGET_OPTIONS, "pool": "cls", "opset": 18})
    with pytest.raises(UsageError) as refused:
        check_options(EXPORT_TARGETS["safetensors"], {**TARGET_OPTIONS, "pool": "cls", "dynamic_batch": True})
    assert str(refused.value) == (
        "--pool, --dynamic-batch: for ONNX output only (an --out ending in .onnx); leave out for .safetensors"
    )
    with pytest.raises(
        UsageError, match="--encoder-only: for --to huggingface only; leave out for --to timm"
    ):
        check_options(EXPORT_TARGETS["timm"], {**TARGET_OPTIONS, "encoder_only": True})
    with pytest.raises(UsageError, match="--ema: for --out OUT.safetensors only; leave out for .onnx"):
        check_options(EXPORT_TARGETS["onnx"], {**TARGET_OPTIONS, "ema": True})
