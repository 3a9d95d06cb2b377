"""Files of the official MAE code (``mae.convert.formats.official``): recognised by their ``model`` dict,
read with the heads and size the pickled ``args`` give, loaded strictly with the same outputs."""

import argparse

import torch

from mae import load_backbone, load_mae
from mae.convert.formats import official
from mae.convert.formats.base import CheckpointPath
from tests.unit.convert.formats.conftest import same_outputs


def _write(model, path, args: argparse.Namespace | None) -> None:
    torch.save({"model": model.state_dict(), "epoch": 799, **({"args": args} if args else {})}, path)


def test_detect__a_dict_with_a_model_state_dict(tiny_mae, tmp_path):
    _write(tiny_mae, tmp_path / "checkpoint-799.pth", None)
    assert official.detect(CheckpointPath(tmp_path / "checkpoint-799.pth"))
    torch.save(tiny_mae.state_dict(), tmp_path / "plain.pth")
    assert not official.detect(CheckpointPath(tmp_path / "plain.pth"))
    assert not official.detect(CheckpointPath(tmp_path))


def test_read__heads_and_size_from_args_then_strict_loads_with_the_same_outputs(tiny_mae, tmp_path):
    args = argparse.Namespace(model="mae_vit_tiny_patch4", input_size=32, norm_pix_loss=True)
    _write(tiny_mae, tmp_path / "with_args.pth", args)
    ckpt = official.read(CheckpointPath(tmp_path / "with_args.pth"))
    assert ckpt.format == "official" and ckpt.notes == [] and ckpt.config["target"] == "norm_pix"
    assert (ckpt.config["num_heads"], ckpt.config["decoder_num_heads"], ckpt.config["img_size"]) == (
        3,
        4,
        (32, 32),
    )
    model, report = load_mae(tmp_path / "with_args.pth")
    assert not report.missing and not report.ignored and same_outputs(model.eval(), tiny_mae)
    assert same_outputs(load_backbone(tmp_path / "with_args.pth").eval(), tiny_mae)


def test_read__without_args_heads_are_assumed_and_said(tiny_mae, tmp_path):
    _write(tiny_mae, tmp_path / "bare.pth", None)
    ckpt = official.read(CheckpointPath(tmp_path / "bare.pth"))
    assert ckpt.config["num_heads"] == 3  # ViT-Ti's width, 192
    assert any("num_heads=3 assumed from width 192" in note for note in ckpt.notes)
