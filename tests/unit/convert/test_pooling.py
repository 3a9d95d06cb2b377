"""``mae.convert.pooling``: a CNN's maps pooled as timm pools them (the spatial mean; ConvNeXt's head norm
after it), checked against the mean and LayerNorm computed by hand; a cls pool refused for a CNN by name;
the default pool per kind of encoder."""

import pytest
import timm
import torch
from torch.nn import functional as F

from mae.convert.pooling import default_pool, encoder_family, pooled
from mae.errors import ConfigError
from mae.models import create_model
from tests.helpers import tiny_mae

IMGS = torch.randn(2, 3, 32, 32, generator=torch.Generator().manual_seed(0))


@pytest.fixture(scope="module")
def resnet() -> torch.nn.Module:
    torch.manual_seed(0)
    return timm.create_model("resnet10t", num_classes=0).eval()


@pytest.fixture(scope="module")
def convnext() -> torch.nn.Module:
    torch.manual_seed(0)
    return timm.create_model("convnextv2_atto", num_classes=0).eval()


@pytest.fixture(scope="module")
def mae_cnn() -> torch.nn.Module:
    torch.manual_seed(0)
    return create_model("spark", img_size=32, encoder="resnet10t", mask_unit=8, decoder_width=64).eval()


def test_pooled__a_resnet_avg_is_the_mean_of_its_last_map(resnet):
    with torch.no_grad():
        expected = resnet.forward_features(IMGS).mean(dim=(2, 3))  # (2, 512, 1, 1) -> (2, 512)
        assert torch.equal(pooled(resnet, "avg")(IMGS), expected)


def test_pooled__a_convnext_avg_is_the_mean_then_its_head_norm(convnext):
    norm = convnext.head.norm
    with torch.no_grad():
        mean = convnext.forward_features(IMGS).mean(dim=(2, 3))
        expected = F.layer_norm(mean, mean.shape[-1:], norm.weight, norm.bias, norm.eps)
        got = pooled(convnext, "avg")(IMGS)
    assert got.shape == (2, 320) and torch.allclose(got, expected, atol=1e-6)
    assert not torch.allclose(got, mean, atol=1e-3)  # the head norm is applied


def test_pooled__an_mae_cnn_pools_its_unmasked_timm_encoder(mae_cnn):
    with torch.no_grad():
        mae_cnn(IMGS, 0.6)  # a masked forward first: its mask must not stay set
        expected = mae_cnn.encoder.forward_features(IMGS).mean(dim=(2, 3))
        assert torch.equal(pooled(mae_cnn, "avg")(IMGS), expected)


@pytest.mark.parametrize("pool", ["cls", "both"])
def test_pooled__a_cls_pool_of_a_cnn_is_refused_naming_the_pool_and_the_model(pool, resnet, mae_cnn):
    refused = rf"^pool '{pool}' reads a cls token, and the CNN resnet10t has none"
    for model in (resnet, mae_cnn):
        with pytest.raises(ConfigError, match=refused):
            pooled(model, pool)


def test_default_pool__cls_for_a_vit_avg_for_a_cnn(resnet, convnext, mae_cnn):
    mae_vit = tiny_mae()
    assert encoder_family(mae_vit) == "vit" and default_pool(mae_vit) == "cls"
    vit = timm.create_model("vit_tiny_patch16_224", img_size=32, depth=1, num_classes=0)
    assert default_pool(vit) == "cls"
    assert encoder_family(mae_cnn) == "cnn"
    assert default_pool(resnet) == default_pool(convnext) == default_pool(mae_cnn) == "avg"


# Features from any block: each block's tokens through the final norm, pooled, concatenated in block order.

from mae.convert.backbone import build_vit  # noqa: E402
from mae.convert.pooling import blocks_read, pooled_width, resolve_blocks  # noqa: E402


def _timm_vit(mae_vit, depth=None):
    """A timm ViT holding ``mae_vit``'s encoder weights, cut to its first ``depth`` blocks."""
    config = dict(mae_vit.config, depth=depth or mae_vit.config["depth"])
    vit = build_vit(config).eval()
    state = {
        k: v for k, v in mae_vit.state_dict().items() if not k.startswith("decoder") and k != "mask_token"
    }
    state = {
        k: v
        for k, v in state.items()
        if not k.startswith("blocks.") or int(k.split(".")[1]) < config["depth"]
    }
    vit.load_state_dict(state)
    return vit


@pytest.mark.parametrize("pool", ["cls", "avg", "both"])
def test_pooled__a_middle_block_is_the_encoder_cut_after_it(pool):
    """Block k read from the whole encoder equals the pooled output of the same encoder cut after block k
    (timm's own forward: the final norm on block k's tokens), for an MAE model and a timm ViT."""
    mae_vit = tiny_mae().eval()
    depth = mae_vit.config["depth"]
    with torch.no_grad():
        for block in range(depth):
            expected = pooled(_timm_vit(mae_vit, block + 1), pool)(IMGS)
            for model in (mae_vit, _timm_vit(mae_vit)):
                got = pooled(model, pool, [block])(IMGS)
                assert torch.allclose(got, expected, atol=1e-5), (block, type(model).__name__)


def test_pooled__several_blocks_are_concatenated_in_block_order_and_the_last_alone_is_the_default():
    mae_vit = tiny_mae().eval()
    depth = mae_vit.config["depth"]
    with torch.no_grad():
        default = pooled(mae_vit, "cls")(IMGS)
        assert torch.equal(pooled(mae_vit, "cls", [-1])(IMGS), default)
        assert torch.equal(pooled(mae_vit, "cls", [depth - 1])(IMGS), default)
        both = pooled(mae_vit, "cls", [-1, 0])(IMGS)  # given in any order: read in block order
        first = pooled(mae_vit, "cls", [0])(IMGS)
    assert both.shape == (2, 2 * mae_vit.config["embed_dim"]) == (2, pooled_width(mae_vit, "cls", [0, -1]))
    assert torch.equal(both, torch.cat([first, default], dim=1))
    assert not torch.allclose(first, default, atol=1e-3)


def test_pooled__cnn_stages_are_the_means_of_timms_feature_maps(resnet):
    """A ResNet's stages 1 and 3 (of its stem + 4 stages), checked against timm's ``features_only`` model."""
    features = timm.create_model("resnet10t", features_only=True, out_indices=(1, 3)).eval()
    features.load_state_dict(
        {k: v for k, v in resnet.state_dict().items() if not k.startswith("fc")}, strict=False
    )
    with torch.no_grad():
        expected = torch.cat([m.mean(dim=(2, 3)) for m in features(IMGS)], dim=1)
        got = pooled(resnet, "avg", [1, -2])(IMGS)
    assert torch.allclose(got, expected, atol=1e-6)
    assert got.shape[1] == pooled_width(resnet, "avg", [1, 3]) == 64 + 256


def test_pooled__an_mae_cnn_reads_the_stages_of_its_timm_encoder(mae_cnn):
    with torch.no_grad():
        assert torch.equal(pooled(mae_cnn, "avg", [1, 3])(IMGS), pooled(mae_cnn.encoder, "avg", [1, 3])(IMGS))


@pytest.mark.parametrize(
    ("blocks", "words"),
    [
        (
            [4],
            "--feature-blocks 4 is not a block of this encoder of depth 4: give 0 to 3, or -1 (the last) "
            "to -4",
        ),
        ([-5], "--feature-blocks -5 is not a block"),
        ([1, -3], "names a block twice"),
        ([], "takes 1 or more blocks"),
        ([True], "True is not a block"),
    ],
)
def test_resolve_blocks__refuses_blocks_the_encoder_lacks_naming_them(blocks, words):
    with pytest.raises(ConfigError, match=words.replace("(", r"\(").replace(")", r"\)")):
        resolve_blocks(blocks, 4)


def test_pooled__a_block_outside_the_encoder_is_refused_before_any_image(resnet):
    with pytest.raises(ConfigError, match="depth 5"):
        pooled(resnet, "avg", [5])


def test_blocks_read__names_the_blocks_one_based_for_the_printed_line(resnet):
    mae_vit = tiny_mae()
    assert blocks_read(mae_vit, None) == "block 2 of 2"
    assert blocks_read(mae_vit, [-1, 0]) == "blocks 1+2 of 2 (concatenated)"
    assert blocks_read(resnet, [-2]) == "stage 4 of 5"
