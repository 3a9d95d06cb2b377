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
