"""A pretrained CNN as a detection backbone (``mae.dense.models.cnn_pyramid``): its own stride-4 .. 32 maps
under torchvision's FPN, taken by the detectors and the segmenter as the ViT's pyramid is."""

import pytest
import timm
import torch
from torchvision.ops import FeaturePyramidNetwork
from torchvision.ops.feature_pyramid_network import LastLevelMaxPool

from mae.dense.models.cnn_pyramid import CNNFeaturePyramid
from mae.dense.models.pyramid import FEATURE_NAMES, feature_pyramid
from mae.dense.tasks.base import layer_decay_groups
from tests.helpers import untrained_cnn_checkpoint


@pytest.mark.parametrize("name", ["resnet10t", "convnextv2_atto"])
def test_cnn_pyramid__the_last_four_stage_maps_through_torchvisions_fpn_every_parameter_trained(name):
    torch.manual_seed(0)
    encoder = timm.create_model(name, num_classes=0)
    reference = timm.create_model(name, num_classes=0).eval()
    reference.load_state_dict(encoder.state_dict())
    pyramid = CNNFeaturePyramid(encoder, out_channels=8).eval()
    assert pyramid.strides == (4.0, 8.0, 16.0, 32.0, 64.0) and pyramid.encoder is encoder
    images = torch.randn(2, 3, 50, 40)  # padded to 64 x 64 at the right and bottom
    maps = pyramid(images)
    assert list(maps) == list(FEATURE_NAMES)
    for (key, m), stride in zip(maps.items(), pyramid.strides, strict=True):
        assert m.shape == (2, 8, 64 // stride, 64 // stride), key
    # by hand: timm's own maps of the padded image, torchvision's FPN with the pyramid's weights
    fpn = FeaturePyramidNetwork(
        [info["num_chs"] for info in reference.feature_info[-4:]], 8, extra_blocks=LastLevelMaxPool()
    )
    fpn.load_state_dict(pyramid.fpn.state_dict())
    padded = torch.nn.functional.pad(images, (0, 24, 0, 14))
    with torch.no_grad():
        stages = reference.forward_intermediates(padded, intermediates_only=True)[-4:]
        expected = fpn({str(i): s for i, s in enumerate(stages)})
        for key in FEATURE_NAMES:
            torch.testing.assert_close(maps[key], expected[key])
    # the pruned encoder (no head, no head norm) keeps timm's names, and every parameter left learns
    assert set(encoder.state_dict()) <= set(reference.state_dict())
    sum(m.sum() for m in pyramid.train()(images).values()).backward()
    assert [n for n, p in pyramid.named_parameters() if p.grad is None] == []
    # layer decay over timm's blocks: the last at layer_decay, the stem the lowest, the FPN at 1
    groups = layer_decay_groups(pyramid, pyramid.encoder, 0.05, 0.5)
    encoder_scales = [g["lr_scale"] for g in groups if g["name"].startswith("encoder")]
    assert max(encoder_scales) == 0.5 and {g["lr_scale"] for g in groups if "heads" in g["name"]} == {1.0}
    stem = next(p for n, p in encoder.named_parameters() if n.startswith(("conv1", "stem")))
    assert next(g["lr_scale"] for g in groups if any(p is stem for p in g["params"])) == min(encoder_scales)


def test_feature_pyramid__a_cnn_checkpoint_gives_its_pyramid_and_the_vit_options_are_refused_by_name(
    tmp_path,
):
    checkpoint = untrained_cnn_checkpoint(tmp_path / "cnn.ckpt", "resnet10t")
    pyramid = feature_pyramid(checkpoint, out_channels=8)
    assert isinstance(pyramid, CNNFeaturePyramid) and pyramid.detector_sizes() == {
        "min_size": 32,
        "max_size": 32,
    }
    saved = torch.load(checkpoint, weights_only=True)["state_dict"]
    for key, value in pyramid.encoder.state_dict().items():
        assert torch.equal(value, saved[f"model.encoder.{key}"]), key
    for option, value in [
        ("window_size", 4),
        ("block", 2),
        ("scales", [2, 1, 0.5, 0.25]),
        ("max_tokens", 10),
    ]:
        with pytest.raises(
            ValueError, match=f"model.{option} .* is an option of the ViT's feature pyramid; resnet10t"
        ):
            feature_pyramid(checkpoint, **{option: value})


def test_dense_modules__a_cnn_checkpoint_under_its_pyramid_sized_as_pretrained_vit_options_refused(tmp_path):
    from mae.dense.tasks.detection import MAEDetectionModule

    checkpoint = untrained_cnn_checkpoint(tmp_path / "cnn.ckpt", "resnet10t")
    settings = dict(
        encoder=dict(checkpoint=str(checkpoint)), img_size=64, num_classes=3, detector="faster_rcnn"
    )
    module = MAEDetectionModule(out_channels=8, head_channels=8, **settings)
    assert isinstance(module.pyramid, CNNFeaturePyramid) and module.encoder is module.pyramid.encoder
    assert module.pyramid.detector_sizes() == {"min_size": 32, "max_size": 32}  # the pretraining's 32 px
    assert module.architecture_record()["args"]["pyramid"] == "CNNFeaturePyramid"
    # the plan: the encoder's blocks decayed below the FPN and heads, the last block at layer_decay (0.7)
    scale = {
        name: module.param_groups.settings[i]["lr_scale"] for name, i in module.param_groups.group_of.items()
    }
    assert scale["backbone.encoder.layer4.0.conv1.weight"] == pytest.approx(0.7)
    assert scale["backbone.encoder.conv1.0.weight"] == pytest.approx(0.7**5)
    assert scale["backbone.fpn.inner_blocks.0.0.weight"] == 1.0
    with pytest.raises(
        ValueError, match="model.relative_position True is an option of the ViT's feature pyramid"
    ):
        MAEDetectionModule(relative_position=True, window_size=None, **settings)
