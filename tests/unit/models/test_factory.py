"""The named model sizes (``mae.models.factory``): the official sizes and timm's encoder shapes, the small
variants, unknown names and arguments listed with the valid ones, and the class the decoder switches
choose."""

import pytest
import torch

from mae.models import MODEL_REGISTRY, MaskedAutoencoderViT, build_mae, create_model
from mae.models.decoder_variants import CrossMAE, PartialReconstructionMAE
from tests.helpers import DECODER_VARIANTS as VARIANTS
from tests.helpers import TINY

CLASSES = {"paper": MaskedAutoencoderViT, "partial": PartialReconstructionMAE, "cross": CrossMAE}


@pytest.mark.parametrize("name", ["paper", *VARIANTS])
def test_switches__the_factory_builds_the_class_that_implements_them_with_the_paper_s_state_dict_keys(name):
    kwargs, cls = VARIANTS.get(name, {}), CLASSES[name.split("_")[0]]
    model = build_mae(**TINY, **kwargs)
    assert type(model) is cls and isinstance(model, MaskedAutoencoderViT)
    assert type(create_model("mae_vit_tiny_patch4", depth=2, decoder_depth=2, **kwargs)) is cls
    paper = MaskedAutoencoderViT(**TINY)
    if cls is not CrossMAE:
        assert list(model.state_dict()) == list(paper.state_dict())
    else:  # the cross blocks' own names, under the same decoder_blocks.<i> prefix
        encoder = [key for key in paper.state_dict() if not key.startswith("decoder_blocks.")]
        assert [key for key in model.state_dict() if not key.startswith("decoder_blocks.")] == encoder
    assert model.config == {**paper.config, **kwargs, "decoder_encoder_layers": model.decoder_encoder_layers}


@pytest.mark.parametrize(
    "name, dims",
    [
        ("mae_vit_base_patch16", (16, 768, 12, 12)),
        ("mae_vit_large_patch16", (16, 1024, 24, 16)),
        ("mae_vit_huge_patch14", (14, 1280, 32, 16)),
    ],
)
def test_factories__official_sizes(name, dims):
    model = create_model(name, depth=1)  # depth overridden to keep the test light
    patch, width, _, heads = dims
    assert model.patch_size == patch and model.cls_token.shape[-1] == width
    assert model.blocks[0].attn.num_heads == heads
    assert model.mask_token.shape[-1] == 512 and model.decoder_blocks[0].attn.num_heads == 16
    assert len(model.decoder_blocks) == 8
    assert all(m.eps == 1e-6 for m in model.modules() if isinstance(m, torch.nn.LayerNorm))
    assert model.blocks[0].attn.qkv.bias is not None


@pytest.mark.parametrize(
    "ours, timm_name",
    [
        ("mae_vit_base_patch16", "vit_base_patch16_224"),
        ("mae_vit_large_patch16", "vit_large_patch16_224"),
        ("mae_vit_huge_patch14", "vit_huge_patch14_224"),
    ],
)
def test_encoder__full_size_keys_and_shapes_equal_timm_vit(ours, timm_name):
    import timm

    with torch.device("meta"):  # full sizes without allocating memory
        model = create_model(ours)
        vit = timm.create_model(timm_name, pretrained=False, num_classes=0)
    encoder = {
        k: tuple(v.shape)
        for k, v in model.state_dict().items()
        if not k.startswith("decoder") and k != "mask_token"
    }
    assert encoder == {k: tuple(v.shape) for k, v in vit.state_dict().items()}
    assert len(model.decoder_blocks) == 8


def test_factories__small_variants():
    tiny = create_model("mae_vit_tiny_patch16", decoder_depth=1)
    assert tiny.cls_token.shape[-1] == 192 and len(tiny.blocks) == 12
    cifar = create_model("mae_vit_tiny_patch4")
    assert cifar.grid_size == (8, 8) and cifar.mask_token.shape[-1] == 128
    assert create_model("mae_vit_small_patch16", depth=1).cls_token.shape[-1] == 384
    assert MODEL_REGISTRY["mae_vit_base_patch16_dec512d8b"] is MODEL_REGISTRY["mae_vit_base_patch16"]


def test_create_model__unknown_name_or_argument_lists_the_valid_ones():
    with pytest.raises(ValueError, match="mae_vit_base_patch16"):
        create_model("mae_vit_gigantic")
    with pytest.raises(ValueError, match="decoder_depth"):
        create_model("mae_vit_tiny_patch4", decoder_layers=2)
