"""Attention maps (``mae.inference.attention``): the last block's cls attention, against a plain
softmax(q k^T) written here from the weights, in the ``mae reconstruct --attention`` figure and on
the page."""

import numpy as np
import pytest
import torch
from PIL import Image

from mae.apps.page.demo import ReconstructionSession, page_outputs
from mae.cli.main import invoke
from mae.convert.backbone import build_vit
from mae.inference.attention import attention_weights, cls_attention_maps, last_block_attention
from mae.models import MaskedAutoencoderViT
from tests.helpers import TINY, tiny_pretraining_checkpoint


@pytest.fixture
def model() -> MaskedAutoencoderViT:
    torch.manual_seed(0)
    model = MaskedAutoencoderViT(**TINY).eval()  # 32x32 inputs, 4x4 patches: an 8x8 grid, 4 heads of 16
    with torch.no_grad():  # sharper attention than the initialisation's, so the maps differ from head to head
        model.blocks[-1].attn.qkv.weight.mul_(4)
    return model


def _plain_softmax_attention(model: MaskedAutoencoderViT, imgs: torch.Tensor) -> torch.Tensor:
    """(N, heads, T, T) softmax(q k^T / sqrt(d)) of the last block, from its weight matrices alone."""
    x = model.patch_embed(imgs) + model.pos_embed[:, 1:]
    x = torch.cat([(model.cls_token + model.pos_embed[:, :1]).expand(len(x), -1, -1), x], dim=1)
    for block in model.blocks[:-1]:
        x = block(x)
    last = model.blocks[-1]
    h = last.norm1(x).double()
    D, heads = h.shape[-1], last.attn.num_heads
    weight, bias = last.attn.qkv.weight.double(), last.attn.qkv.bias.double()
    q = (h @ weight[:D].T + bias[:D]).unflatten(-1, (heads, D // heads)).transpose(1, 2)
    k = (h @ weight[D : 2 * D].T + bias[D : 2 * D]).unflatten(-1, (heads, D // heads)).transpose(1, 2)
    return torch.softmax(q @ k.transpose(-2, -1) / (D // heads) ** 0.5, dim=-1).float()


@torch.no_grad()
def test_attention__rows_sum_to_1_and_equal_a_plain_softmax_in_both_timm_paths(model):
    imgs = torch.randn(2, 3, 32, 32, generator=torch.Generator().manual_seed(1))
    expected = _plain_softmax_attention(model, imgs)
    attn = model.blocks[-1].attn
    for fused in (True, False):  # recomputed from the module's input / timm's own weights at attn_drop
        attn.fused_attn = fused
        weights = last_block_attention(model, imgs)
        assert weights.shape == (2, 4, 65, 65)
        torch.testing.assert_close(weights.sum(-1), torch.ones(2, 4, 65))
        torch.testing.assert_close(weights, expected, atol=1e-6, rtol=1e-5)
    assert not attn._forward_hooks and not attn.attn_drop._forward_hooks  # the hooks are removed


@torch.no_grad()
def test_attention__the_recomputed_weights_rebuild_the_modules_own_output(model):
    imgs = torch.randn(2, 3, 32, 32, generator=torch.Generator().manual_seed(2))
    attn = model.blocks[-1].attn
    assert attn.fused_attn  # timm's default on torch 2: scaled_dot_product_attention, no weights formed
    seen = {}
    handle = attn.register_forward_hook(lambda module, args, output: seen.update(x=args[0], out=output))
    model.forward_features(imgs)
    handle.remove()
    x = seen["x"]
    weights = attention_weights(attn, x)
    N, T, D = x.shape
    v = attn.qkv(x).reshape(N, T, 3, attn.num_heads, attn.head_dim).permute(2, 0, 3, 1, 4)[2]
    rebuilt = attn.proj(attn.norm((weights @ v).transpose(1, 2).reshape(N, T, D)))
    torch.testing.assert_close(rebuilt, seen["out"], atol=1e-5, rtol=1e-5)


@torch.no_grad()
def test_cls_attention_maps__are_the_cls_row_on_the_patch_grid_unrenormalised(model):
    imgs = torch.randn(3, 3, 32, 32, generator=torch.Generator().manual_seed(3))
    maps = cls_attention_maps(model, imgs)
    expected = _plain_softmax_attention(model, imgs)
    assert maps.shape == (3, 4, 8, 8)
    for i, j in [(0, 0), (0, 7), (5, 2), (7, 7)]:  # raster order: patch (i, j) is token 1 + 8 i + j
        torch.testing.assert_close(maps[:, :, i, j], expected[:, :, 0, 1 + 8 * i + j], atol=1e-6, rtol=1e-5)
    torch.testing.assert_close(maps.sum((-2, -1)), 1 - expected[:, :, 0, 0], atol=1e-5, rtol=1e-5)
    assert (maps[:, 0] - maps[:, 1]).abs().max() > 1e-3  # heads differ
    # a timm ViT holding the same encoder gives the same maps
    vit = build_vit({**model.config, "img_size": (32, 32)}).eval()
    encoder = {k: v for k, v in model.state_dict().items() if not k.startswith(("decoder", "mask_token"))}
    vit.load_state_dict(encoder, strict=False)
    torch.testing.assert_close(cls_attention_maps(vit, imgs), maps)


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    """The tiny pretraining checkpoint: 16x16 inputs, 4x4 patches (a 4x4 grid), 2 heads."""
    return tiny_pretraining_checkpoint(tmp_path_factory.mktemp("attention"))


@pytest.fixture
def photo(tmp_path):
    Image.fromarray(np.random.default_rng(0).integers(0, 256, (16, 16, 3), dtype=np.uint8)).save(
        tmp_path / "p.png"
    )
    return tmp_path / "p.png"


def test_reconstruct__attention_adds_two_panels_to_the_figure(checkpoint, photo, tmp_path, capsys):
    from mae import load_mae
    from mae.inference.images import load_image
    from mae.inference.normalization import Normalization

    args = ["--checkpoint", str(checkpoint), str(photo), "--seed", "1"]
    plain = invoke("reconstruct", [*args, "--out", str(tmp_path / "plain.png")])
    figure = invoke("reconstruct", [*args, "--attention", "--out", str(tmp_path / "attention.png")])
    assert "from the cls token to each patch" in capsys.readouterr().out
    assert plain.attention is None and figure.attention.shape == (1, 2, 4, 4)
    assert figure.losses == plain.losses  # the reconstruction is the same
    scale = 10  # 16-pixel panels enlarged to at least 160 pixels
    assert figure.image.width - plain.image.width == 2 * (16 + 2) * scale
    assert Image.open(tmp_path / "attention.png").size == figure.image.size
    # the brightest patch of the mean panel is where the mean over heads of a plain softmax peaks
    model, _ = load_mae(checkpoint)
    img = load_image(photo, (16, 16), Normalization.of(None, 3, "test"))[None]
    mean = _plain_softmax_attention(model.eval(), img)[0, :, 0, 1:].mean(0).reshape(4, 4)
    i, j = divmod(int(mean.argmax()), 4)
    pixels = np.asarray(figure.image.convert("RGB"), dtype=np.int16)
    left = 220 + (4 * 18 + 2) * scale  # the label column, then four panels and their borders
    panel = pixels[18 + 2 * scale : 18 + 18 * scale, left : left + 16 * scale]  # below the headers
    assert panel.shape[:2] == (160, 160)
    patch = panel[i * 40 : (i + 1) * 40, j * 40 : (j + 1) * 40]
    assert (patch == 255).all()  # white: the map's maximum
    assert (panel == 255).all(-1).sum() == 40 * 40 * int((mean >= mean.max() - 1e-7).sum())


def test_page_outputs__the_attention_toggle_adds_its_picture_and_leaves_the_panels(checkpoint, photo):
    session = ReconstructionSession(checkpoint)
    off = page_outputs(session, photo, "p.png", 0.75, "random", 0, "patch", False)
    on = page_outputs(session, photo, "p.png", 0.75, "random", 0, "patch", True)
    assert len(off) == len(on) == 6
    assert off[4] is None and "cls token" not in off[5]
    assert isinstance(on[4], Image.Image) and "the mean of its 2 heads" in on[5]
    assert on[4].width == 2 * on[0].width + 3 * 2 * 16  # mean | heads, enlarged as the panels, with borders
    for a, b in zip(off[:4], on[:4], strict=True):
        assert np.array_equal(np.asarray(a), np.asarray(b))  # the reconstruction panels do not change
    bad = page_outputs(session, photo, "p.png", 0.75, "random", None, "patch", True)
    assert bad[:5] == [None] * 5 and "mask seed" in bad[5]


def test_last_block_attention__a_cnn_is_refused_naming_it():
    from mae.errors import ConfigError
    from mae.models import create_model

    cnn = create_model("spark", encoder="resnet10t", img_size=32, mask_unit=8, decoder_width=64)
    with pytest.raises(ConfigError, match="attention maps need a ViT, and the encoder is the CNN resnet10t"):
        last_block_attention(cnn, torch.zeros(1, 3, 32, 32))
