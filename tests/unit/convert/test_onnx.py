"""``mae export CHECKPOINT OUT.onnx``: the encoder as ONNX, run by onnxruntime, against the
MAE model's own ``forward_features`` (not the exporter's ``load_backbone`` path)."""

import json
import os
import sys

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from mae.cli.main import invoke
from mae.convert.architecture import mae_record
from mae.convert.onnx import check_with_onnxruntime, supported_opsets
from mae.models import MaskedAutoencoderViT
from tests.helpers import run_mae

if os.environ.get("CI", "").lower() in ("1", "true"):  # CI installs the onnx extra: missing, it fails
    import onnx
    import onnxruntime
else:
    onnxruntime = pytest.importorskip("onnxruntime", reason="the onnx extra: pip install -e '.[onnx]'")
    onnx = pytest.importorskip("onnx", reason="the onnx extra: pip install -e '.[onnx]'")

CONFIG = dict(
    img_size=16,
    patch_size=4,
    in_chans=1,
    embed_dim=32,
    depth=2,
    num_heads=2,
    decoder_embed_dim=16,
    decoder_depth=1,
    decoder_num_heads=2,
)
MEAN, STD = [0.3], [0.2]


@pytest.fixture(scope="module")
def model() -> MaskedAutoencoderViT:
    torch.manual_seed(0)
    model = MaskedAutoencoderViT(**CONFIG).eval()
    with torch.no_grad():  # non-trivial norms and cls token, so loading mistakes show
        for m in model.modules():
            if isinstance(m, torch.nn.LayerNorm):
                m.weight.normal_(1.0, 0.1)
                m.bias.normal_(0.0, 0.1)
        model.cls_token.normal_()
    return model


@pytest.fixture(scope="module")
def checkpoint(model, tmp_path_factory):
    """Our pretraining checkpoint of the 1-channel model, with its data's mean / std recorded."""
    path = tmp_path_factory.mktemp("onnx") / "last.ckpt"
    torch.save(
        {
            "pytorch-lightning_version": "2.6.6",
            "state_dict": {f"model.{k}": v for k, v in model.state_dict().items()},
            "mae_architecture": mae_record(model.config),
            "mae_data": {"in_chans": 1, "img_size": [16, 16], "mean": MEAN, "std": STD},
        },
        path,
    )
    return path


@pytest.fixture(scope="module")
def tokens_at_24(checkpoint):
    """Every token at a new input size (24: a 6x6 grid), batch 1, through ``main``."""
    out = checkpoint.parent / "tokens24.onnx"
    export = invoke("export", ["--checkpoint", str(checkpoint), "--out", str(out), "--img-size", "24"])
    return out, export


def _run(path, pixels: torch.Tensor) -> np.ndarray:
    session = onnxruntime.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    return session.run(None, {"pixels": pixels.numpy()})[0]


def _metadata(path) -> dict[str, str]:
    return {p.key: p.value for p in onnx.load(str(path)).metadata_props}


@pytest.mark.slow
def test_onnx_export__command_line_one_channel_pooled_dynamic_batch_into_a_missing_folder(
    model, checkpoint, tmp_path
):
    out = tmp_path / "new" / "deeper" / "encoder.onnx"  # folders that do not exist yet
    result = run_mae(
        "export", "--checkpoint", str(checkpoint), "--out", str(out), "--dynamic-batch", "--pool", "avg"
    )
    assert "onnxruntime vs torch, batch 1: max abs difference" in result.stdout
    assert "batch 3: max abs difference" in result.stdout, result.stdout
    assert sorted(p.name for p in out.parent.iterdir()) == ["encoder.onnx"]  # no temporary file left
    torch.manual_seed(1)
    for batch in (1, 2, 5):
        pixels = torch.randn(batch, 1, 16, 16)
        with torch.no_grad():
            expected = model.forward_features(pixels)[:, 1:].mean(1)  # the mean of the normed patch tokens
        got = _run(out, pixels)
        assert got.shape == (batch, 32)
        assert np.abs(got - expected.numpy()).max() <= 1e-4
    meta = _metadata(out)
    assert json.loads(meta["mae.mean"]) == MEAN and json.loads(meta["mae.std"]) == STD
    assert meta["mae.in_chans"] == "1" and meta["mae.pool"] == "avg"
    assert (
        "(x - mean[c]) / std[c] with mean = [0.3], std = [0.2] (recorded in the checkpoint)"
        in meta["mae.input"]
    )
    assert "mean = [0.3], std = [0.2]" in result.stdout


def test_onnx_export__tokens_at_a_new_size_match_torch_and_take_batch_1(model, tokens_at_24, capsys):
    out, export = tokens_at_24
    assert export.input_shape == [1, 1, 24, 24] and export.output_shape == [1, 37, 32]
    assert export.metadata["mae.output"].startswith(
        "tokens: float32 (1, 37, 32)"
    )  # batch 1 only: not (N, ...)
    assert export.metadata["mae.input"].startswith("pixels: float32 (1, 1, 24, 24)")
    assert 0 < export.differences[1] <= 1e-4
    # independent: the MAE at 24 pixels, its position embeddings resampled bicubically by hand
    big = MaskedAutoencoderViT(**{**CONFIG, "img_size": 24}).eval()
    state = dict(model.state_dict())
    grid = state["pos_embed"][:, 1:].reshape(1, 4, 4, 32).permute(0, 3, 1, 2)
    resampled = F.interpolate(grid, size=(6, 6), mode="bicubic", align_corners=False).permute(0, 2, 3, 1)
    state["pos_embed"] = torch.cat([state["pos_embed"][:, :1], resampled.reshape(1, 36, 32)], dim=1)
    state.pop("decoder_pos_embed")
    big.load_state_dict(state, strict=False)
    pixels = torch.randn(1, 1, 24, 24, generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        expected = big.forward_features(pixels).numpy()
    got = _run(out, pixels)
    assert got.shape == (1, 37, 32) and np.abs(got - expected).max() <= 1e-4
    assert np.abs(got - expected).max() < np.abs(expected).max() * 1e-3  # not a trivially small output
    with pytest.raises(Exception, match="(?i)dimension|shape"):  # a static export: batch 1 only
        _run(out, torch.randn(2, 1, 24, 24))
    inputs = onnx.load(str(out)).graph.input
    assert [d.dim_value for d in inputs[0].type.tensor_type.shape.dim] == [1, 1, 24, 24]


def test_onnx_check__outputs_that_differ_from_torch_fail_loudly(model, tokens_at_24):
    out, _ = tokens_at_24
    from mae.convert.backbone import load_backbone

    backbone = load_backbone(out.parent / "last.ckpt", img_size=24).eval()
    assert check_with_onnxruntime(backbone.forward_features, out, (1,))[1] <= 1e-4
    with torch.no_grad():
        backbone.norm.bias.add_(1e-3)  # a model that is not the file's
    with pytest.raises(ValueError, match=r"differs from torch's by 0\.001 .*over the 0\.0001 allowed"):
        check_with_onnxruntime(backbone.forward_features, out, (1,))


def test_onnx_export__an_opset_the_exporter_lacks_is_named_with_the_range(checkpoint, tmp_path):
    lowest, highest = supported_opsets()
    assert lowest <= 18 <= highest
    for opset in (lowest - 1, highest + 1):
        with pytest.raises(
            ValueError, match=f"--opset {opset}: .* writes opsets {lowest} to {highest}; choose one"
        ):
            invoke(
                "export",
                ["--checkpoint", str(checkpoint), "--out", str(tmp_path / "x.onnx"), "--opset", str(opset)],
            )
    assert not list(tmp_path.iterdir())


def test_onnx_export__onnx_options_with_a_safetensors_output_are_refused(checkpoint, tmp_path, capsys):
    with pytest.raises(SystemExit) as exit_:
        invoke(
            "export",
            [
                "--checkpoint",
                str(checkpoint),
                "--out",
                str(tmp_path / "enc.safetensors"),
                "--dynamic-batch",
                "--pool",
                "cls",
            ],
        )
    assert exit_.value.code == 2
    assert (
        "--pool, --dynamic-batch: for ONNX output only (an --out ending in .onnx); leave out for .safetensors"
        in capsys.readouterr().err
    )


@pytest.mark.parametrize("atol", ["nan", "inf", "-1"])
def test_onnx_export__a_tolerance_that_is_not_a_finite_difference_is_refused(
    checkpoint, tmp_path, capsys, atol
):
    with pytest.raises(SystemExit) as exit_:
        invoke(
            "export", ["--checkpoint", str(checkpoint), "--out", str(tmp_path / "enc.onnx"), "--atol", atol]
        )
    assert exit_.value.code == 2
    assert (
        f"--atol must be a finite difference >= 0 (default 1e-4), got {float(atol)}"
        in capsys.readouterr().err
    )
    assert not (tmp_path / "enc.onnx").exists()


def test_write_onnx__a_file_that_fails_its_check_or_is_too_large_is_not_written(tmp_path, monkeypatch):
    from mae.convert import onnx as onnx_writer
    from mae.convert.onnx import write_onnx

    torch.manual_seed(0)
    conv = torch.nn.Conv2d(1, 2, 4, stride=4)
    out = tmp_path / "conv.onnx"
    with pytest.raises(ValueError, match="must end in .onnx"):
        write_onnx(conv, tmp_path / "conv.pt", torch.randn(1, 1, 8, 8), "pixels", "maps", {})
    with pytest.raises(
        ValueError, match=r"differs from torch's by .* over the -1 allowed: the ONNX file was not"
    ):
        write_onnx(conv, out, torch.randn(1, 1, 8, 8), "pixels", "maps", {"k": "v"}, atol=-1.0)
    assert not list(tmp_path.iterdir())  # neither the file nor a temporary one
    monkeypatch.setattr(onnx_writer, "MAX_ONNX_BYTES", 100)  # the conv's 34 float32 weights are 136 bytes
    with pytest.raises(ValueError, match="over the 2 GiB one ONNX file holds"):
        write_onnx(conv, out, torch.randn(1, 1, 8, 8), "pixels", "maps", {})
    assert not list(tmp_path.iterdir())


def test_onnx_export__without_the_onnx_extra_an_error_line_naming_it(
    checkpoint, tmp_path, capsys, monkeypatch
):
    from functools import partial

    from mae.cli.command import USAGE_ERROR_EXIT_CODE, run_command

    monkeypatch.setitem(sys.modules, "onnxscript", None)  # as if the extra were not installed
    monkeypatch.delenv("MAE_DEBUG", raising=False)
    with pytest.raises(SystemExit) as stopped:
        run_command(
            partial(invoke, "export", ["--checkpoint", str(checkpoint), "--out", str(tmp_path / "e.onnx")])
        )
    assert stopped.value.code == USAGE_ERROR_EXIT_CODE
    last = capsys.readouterr().err.strip().splitlines()[-1]
    assert last.startswith('error: ONNX export needs the onnx extra: pip install -e ".[onnx]"')
    assert not (tmp_path / "e.onnx").exists()


def test_onnx_export__a_cnn_encoder_its_last_map_as_torch_computes_it(tmp_path):
    from mae import load_backbone
    from tests.helpers import untrained_cnn_checkpoint

    checkpoint = untrained_cnn_checkpoint(tmp_path / "cnn.ckpt")
    out = tmp_path / "cnn.onnx"
    invoke("export", ["--checkpoint", str(checkpoint), "--out", str(out)])
    imgs = torch.randn(1, 3, 32, 32, generator=torch.Generator().manual_seed(2))
    (maps,) = onnxruntime.InferenceSession(str(out)).run(None, {"pixels": imgs.numpy()})
    with torch.no_grad():
        np.testing.assert_allclose(maps, load_backbone(checkpoint).eval().forward_features(imgs), atol=1e-5)
    meta = {p.key: p.value for p in onnx.load(str(out)).metadata_props}
    assert meta["mae.output"].startswith("maps: float32 (1, 512, 1, 1): the CNN's last feature map")
    assert "ViT" not in meta["mae.output"] and "token" not in meta["mae.output"]
