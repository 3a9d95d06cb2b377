"""The table of targets and how the model uses it: each member's width is what it computes, it holds no
weights, ``decoder_pred`` is sized by it, the loss is the masked MSE against it, and the official
``norm_pix_loss`` still names the target."""

import pytest
import torch

from mae.errors import ConfigError
from mae.models import MaskedAutoencoderViT, build_mae, create_model
from mae.models.loss import masked_patch_mse
from mae.models.targets import TARGETS, build_target, target_of
from tests.helpers import TINY

# The targets computed from the images alone; ``features`` needs a teacher (its own tests: test_features).
OWN = sorted(name for name, cls in TARGETS.items() if not cls.option_names)


@pytest.mark.parametrize("name", OWN)
def test_targets__width_is_what_the_target_computes_and_it_holds_no_weights(name):
    assert TARGETS[name].name == name
    for patch, channels in ((4, 1), (4, 3), (8, 5), (16, 3)):
        target = build_target(name, patch, channels)
        assert target.dim == TARGETS[name].width(patch, channels)
        imgs = torch.randn(2, channels, 2 * patch, 3 * patch)
        assert target(imgs).shape == (2, 6, target.dim)
        assert not list(target.parameters()) and not target.state_dict()


def test_targets__an_unknown_name_is_refused_listing_the_known_ones():
    known = "pixel, norm_pix, hog, features"
    with pytest.raises(ConfigError, match=f"model.target must be one of {known}; got 'hgo'"):
        build_target("hgo", 16, 3)


@pytest.mark.parametrize("name", OWN)
def test_model__decoder_pred_is_sized_by_the_target_and_the_loss_is_the_masked_mse_against_it(name):
    torch.manual_seed(0)
    model = MaskedAutoencoderViT(**TINY, target=name)
    assert model.decoder_pred.out_features == TARGETS[name].width(4, 3) and model.config["target"] == name
    pixel = MaskedAutoencoderViT(**TINY, target="pixel")
    assert model.state_dict().keys() == pixel.state_dict().keys()  # a target adds no weight
    imgs = torch.randn(2, 3, 32, 32)
    loss, pred, mask = model(imgs, 0.75)
    assert pred.shape == (2, 64, model.target.dim)
    torch.testing.assert_close(loss, masked_patch_mse(pred, build_target(name, 4, 3)(imgs), mask))


def test_model__the_official_norm_pix_loss_names_the_target():
    torch.manual_seed(0)
    official = create_model("mae_vit_tiny_patch4", depth=1, decoder_depth=1, norm_pix_loss=True)
    torch.manual_seed(0)
    ours = create_model("mae_vit_tiny_patch4", depth=1, decoder_depth=1, target="norm_pix")
    assert official.config == ours.config and official.norm_pix_loss and "norm_pix_loss" not in ours.config
    imgs, noise = torch.randn(2, 3, 32, 32), torch.rand(2, 64)
    assert torch.equal(official(imgs, 0.75, noise)[0], ours(imgs, 0.75, noise)[0])
    assert MaskedAutoencoderViT(**TINY, norm_pix_loss=False).target.name == "pixel"
    assert MaskedAutoencoderViT(**TINY).target.name == "pixel"  # the official default
    # a 0.4.0 checkpoint's config, which names norm_pix_loss only
    assert build_mae(**{**TINY, "norm_pix_loss": True}).config["target"] == "norm_pix"
    with pytest.raises(ConfigError, match="norm_pix_loss=True means target 'norm_pix', but target is 'hog'"):
        MaskedAutoencoderViT(**TINY, norm_pix_loss=True, target="hog")


def test_target_of__a_config_of_any_release():
    assert target_of({"target": "hog"}) == "hog"
    assert target_of({"norm_pix_loss": True}) == "norm_pix"
    assert target_of({"norm_pix_loss": False}) == target_of({}) == "pixel"
