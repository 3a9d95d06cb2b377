"""What the inference commands do with a checkpoint that lies or a size that cannot work, through their
command lines: NaN / infinite weights are refused naming the file and the tensor (not NaN embeddings or
a figure of loss nan); an image size off the patch grid is refused by every command that takes one (not
embedded on a smaller grid, not exported ignoring pixels); a size whose activations cannot fit is refused
before anything is allocated; attention maps ask for the cls row only."""

import numpy as np
import pytest
import torch
from PIL import Image

from mae.inference.attention import cls_attention_maps, last_block_attention
from mae.models.patch_grid import MAX_PATCHES, check_img_size
from tests.helpers import pretrain_module, run_mae, tiny_pretraining_checkpoint


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    return tiny_pretraining_checkpoint(tmp_path_factory.mktemp("ckpt"))


def with_bad_value(checkpoint, folder, key: str, value: float):
    ckpt = torch.load(checkpoint, weights_only=False)
    ckpt["state_dict"][key].view(-1)[5] = value
    path = folder / "diverged.ckpt"
    torch.save(ckpt, path)
    return path


@pytest.fixture(scope="module")
def nan_checkpoint(checkpoint, tmp_path_factory):
    return with_bad_value(
        checkpoint, tmp_path_factory.mktemp("nan"), "model.blocks.0.mlp.fc1.weight", float("nan")
    )


@pytest.fixture(scope="module")
def image(tmp_path_factory):
    path = tmp_path_factory.mktemp("img") / "one.png"
    Image.fromarray(np.random.default_rng(0).integers(0, 256, (16, 16, 3), dtype=np.uint8)).save(path)
    return path


def embed_argv(checkpoint, image, out, *more: str) -> tuple[str, ...]:
    """``mae embed`` of ``image`` into ``out`` in the main process, quietly; ``more`` after it."""
    return (
        "embed",
        "--checkpoint",
        str(checkpoint),
        str(image),
        "--out",
        str(out),
        "--workers",
        "0",
        "--no-progress",
        *more,
    )


def reconstruct_argv(checkpoint, image, out, *more: str) -> tuple[str, ...]:
    """``mae reconstruct`` of ``image`` into the figure ``out``; ``more`` after it."""
    return ("reconstruct", "--checkpoint", str(checkpoint), str(image), "--out", str(out), *more)


def export_argv(checkpoint, out, *more: str) -> tuple[str, ...]:
    """``mae export`` of ``checkpoint`` into ``out``; ``more`` after it."""
    return ("export", "--checkpoint", str(checkpoint), "--out", str(out), *more)


def last_error(result) -> str:
    assert result.returncode == 2, result.stdout[-2000:] + result.stderr[-2000:]
    assert "Traceback" not in result.stderr, result.stderr[-3000:]
    return result.stderr.strip().splitlines()[-1]


def test_nan_weights__refused_by_name_in_every_inference_command(nan_checkpoint, image, tmp_path):
    commands = {
        "embed": embed_argv(nan_checkpoint, image, tmp_path / "i.npy"),
        "reconstruct": reconstruct_argv(nan_checkpoint, image, tmp_path / "r.png"),
        "export": export_argv(nan_checkpoint, tmp_path / "e.safetensors"),
    }
    for name, command in commands.items():
        error = last_error(run_mae(*command, check=False))
        assert (
            f"{nan_checkpoint} holds non-finite weights: blocks.0.mlp.fc1.weight has 1 NaN or infinite "
            "value(s)" in (error)
        ), name
    assert not list(tmp_path.iterdir())


def test_inf_in_the_decoder__refused_for_reconstruction_not_for_the_encoders_uses(
    checkpoint, image, tmp_path
):
    bad = with_bad_value(checkpoint, tmp_path, "model.decoder_pred.bias", float("inf"))
    error = last_error(run_mae(*reconstruct_argv(bad, image, tmp_path / "r.png"), check=False))
    assert "decoder_pred.bias has 1 NaN or infinite value(s)" in error
    result = run_mae(*embed_argv(bad, image, tmp_path / "i.npy"))
    assert np.isfinite(np.load(tmp_path / "i.npy")).all(), result.stderr


def test_img_size_off_the_patch_grid__one_check_for_every_command(checkpoint, image, tmp_path):
    message = "img_size 30x30 is not divisible by patch_size 4; use a multiple of 4 (e.g. 28)"
    commands = {
        "embed": embed_argv(checkpoint, image, tmp_path / "i.npy", "--img-size", "30"),
        "reconstruct": reconstruct_argv(checkpoint, image, tmp_path / "r.png", "--img-size", "30"),
        "onnx": export_argv(checkpoint, tmp_path / "e.onnx", "--img-size", "30"),
    }
    for name, command in commands.items():
        assert message in last_error(run_mae(*command, check=False)), name
    assert not list(tmp_path.iterdir())


def test_img_size_too_large__refused_before_allocating(checkpoint, tmp_path):
    error = last_error(
        run_mae(
            *export_argv(checkpoint, tmp_path / "e.onnx", "--img-size", "100000"), check=False, timeout=120
        )
    )
    assert (
        "img_size 100000x100000 makes 625,000,000 patches of 4 pixels, over the 65,536 one input may have"
        in error
    )
    with pytest.raises(ValueError, match="over the 65,536"):
        check_img_size(1028, 4)
    assert check_img_size(1024, 4) == (1024, 1024) and (1024 // 4) ** 2 == MAX_PATCHES


def test_attention_maps__only_the_cls_row_is_formed_and_it_matches_the_full_weights():
    torch.manual_seed(0)
    model = pretrain_module().model.eval()
    imgs = torch.randn(2, 3, 16, 16)
    full = last_block_attention(model, imgs)
    cls_row = last_block_attention(model, imgs, queries=slice(0, 1))
    tokens = 1 + model.patch_embed.num_patches
    assert full.shape == (2, model.blocks[-1].attn.num_heads, tokens, tokens)
    assert cls_row.shape == (2, model.blocks[-1].attn.num_heads, 1, tokens)
    torch.testing.assert_close(cls_row[:, :, 0], full[:, :, 0])
    maps = cls_attention_maps(model, imgs)
    torch.testing.assert_close(maps.flatten(2), full[:, :, 0, 1:])
