"""Issue 68's "done when" for the CNN's export: ``mae pretrain --config default_spark`` (SparK's resnet10t
on the built-in digits, cut to two steps) writes a checkpoint that ``mae export`` turns into a timm folder
and a timm ``.safetensors`` file, and a fresh interpreter that imports only timm and torch (not ``mae``)
loads both strictly: the very tensors ``mae.load_backbone`` holds, and its features (to the last bit a CPU
kernel may differ by)."""

import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch

from mae import load_backbone
from tests.helpers import run_mae

# What the fresh interpreter runs: timm alone loads the two exports and writes the features of seeded
# images; it fails if anything imported ``mae``.
TIMM_ALONE = textwrap.dedent(
    """
    import sys

    import timm
    import torch
    from safetensors.torch import load_file

    folder, weights, out = sys.argv[1:]
    by_folder = timm.create_model(f"local-dir:{folder}", pretrained=True).eval()
    by_name = timm.create_model("resnet10t", num_classes=0).eval()
    by_name.load_state_dict(load_file(weights), strict=True)
    imgs = torch.randn(3, 3, 32, 32, generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        features = {"folder": by_folder.forward_features(imgs), "name": by_name.forward_features(imgs)}
        features["pooled"] = by_folder(imgs)
    features["folder_weights"] = by_folder.state_dict()
    features["name_weights"] = by_name.state_dict()
    assert by_folder.num_classes == 0 and type(by_folder).__name__ == "ResNet"
    assert not [name for name in sys.modules if name == "mae" or name.startswith("mae.")], "mae imported"
    torch.save(features, out)
    """
)


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory) -> Path:
    """The last checkpoint of ``mae pretrain --config default_spark``, two steps of one epoch."""
    runs = tmp_path_factory.mktemp("cnn_export") / "runs"
    run_mae(
        "pretrain",
        "--config",
        "default_spark",
        "--trainer.max_epochs",
        "1",
        "--trainer.limit_train_batches",
        "2",
        "--trainer.limit_val_batches",
        "1",
        "--model.optim.warmup_epochs",
        "0",
        "--trainer.logger.init_args.save_dir",
        str(runs),
    )
    return runs / "pretrain_default_spark" / "version_0" / "checkpoints" / "last.ckpt"


def test_export__timm_alone_loads_the_cnn_strictly_and_computes_what_load_backbone_does(checkpoint, tmp_path):
    folder, weights = tmp_path / "resnet10t_timm", tmp_path / "resnet10t.safetensors"
    printed = run_mae("export", "--checkpoint", str(checkpoint), "--to", "timm", "--out", str(folder)).stdout
    assert f'timm.create_model("local-dir:{folder}", pretrained=True)' in printed
    run_mae("export", "--checkpoint", str(checkpoint), "--out", str(weights))
    card = (folder / "README.md").read_text()
    assert "timm's `resnet10t`" in card and "Vision Transformer" not in card

    features = tmp_path / "features.pt"
    script = tmp_path / "timm_alone.py"
    script.write_text(TIMM_ALONE)
    result = subprocess.run(
        [sys.executable, str(script), str(folder), str(weights), str(features)],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    by_timm = torch.load(features, weights_only=True)

    backbone = load_backbone(checkpoint).eval()
    imgs = torch.randn(3, 3, 32, 32, generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        expected, pooled = backbone.forward_features(imgs), backbone(imgs)
    for loaded in (by_timm["folder_weights"], by_timm["name_weights"]):  # load_backbone's very tensors
        assert loaded.keys() == backbone.state_dict().keys()
        assert all(torch.equal(loaded[k], v) for k, v in backbone.state_dict().items())
    # Another process may pick other CPU kernels (its thread count): the same weights, a last bit apart.
    torch.testing.assert_close(by_timm["folder"], expected, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(by_timm["name"], expected, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(by_timm["pooled"], pooled, rtol=1e-5, atol=1e-6)


def test_export__huggingface_is_refused_naming_the_cnn(checkpoint, tmp_path):
    result = run_mae(
        "export",
        "--checkpoint",
        str(checkpoint),
        "--to",
        "huggingface",
        "--out",
        str(tmp_path / "hf"),
        check=False,
    )
    assert result.returncode != 0 and not (tmp_path / "hf").exists()
    assert "holds the convolutional network resnet10t: --to huggingface writes a transformers ViTMAE" in (
        result.stdout + result.stderr
    )
