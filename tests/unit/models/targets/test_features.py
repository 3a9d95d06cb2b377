"""``FeaturesTarget``: a frozen teacher's tokens of one block, checked against the teacher's blocks run by
hand (max difference 0), with and without the LayerNorm (``F.layer_norm``), on another patch size through
the resized image; the teacher stays frozen and out of the student's state dict; what cannot work is refused
at ``set_teacher``, naming the key."""

import pytest
import torch
import torch.nn.functional as F
from timm.models.vision_transformer import VisionTransformer

from mae.errors import ConfigError
from mae.models import build_mae
from mae.models.loss import masked_patch_mse
from mae.models.targets import build_target
from mae.models.targets.features import FeaturesTarget
from tests.helpers import TINY

IDENTITY = {"path": "/runs/teacher.ckpt", "sha256": "ab" * 32}


def _teacher(patch_size: int = 4, img_size: int = 16, depth: int = 3, seed: int = 0) -> VisionTransformer:
    """A seeded timm ViT of width 24, as ``load_teacher`` builds one (``dynamic_img_size``)."""
    torch.manual_seed(seed)
    vit = VisionTransformer(
        img_size=img_size,
        patch_size=patch_size,
        embed_dim=24,
        depth=depth,
        num_heads=2,
        dynamic_img_size=True,
    )
    with torch.no_grad():  # non-trivial position embeddings and cls token
        vit.pos_embed.normal_(std=0.5)
        vit.cls_token.normal_(std=0.5)
    return vit.eval()


def _target(teacher: VisionTransformer, grid=(4, 4), patch_size: int = 4, **options) -> FeaturesTarget:
    target = FeaturesTarget(patch_size, 3, dim=teacher.embed_dim, teacher=IDENTITY, **options)
    target.set_teacher(teacher, grid)
    return target


def _by_hand(teacher: VisionTransformer, imgs: torch.Tensor, block: int) -> torch.Tensor:
    """The tokens after block ``block`` of ``teacher`` on ``imgs`` at its own grid, cls token dropped."""
    x = F.conv2d(imgs, teacher.patch_embed.proj.weight, teacher.patch_embed.proj.bias, stride=4)
    x = x.flatten(2).transpose(1, 2)  # (N, L, D), row-major patches
    x = torch.cat([teacher.cls_token.expand(len(x), -1, -1), x], dim=1) + teacher.pos_embed
    for b in teacher.blocks[: block + 1]:
        x = b(x)
    return x[:, 1:]


@pytest.mark.parametrize("block", [0, 2, -1])
def test_features__the_teachers_block_tokens_run_by_hand(block):
    teacher = _teacher()
    target = _target(teacher, block=block, normalize=False)
    imgs = torch.randn(2, 3, 16, 16)
    with torch.no_grad():
        expected = _by_hand(teacher, imgs, block % 3)
    got = target(imgs)
    assert got.shape == (2, 16, 24) and target.dim == 24
    assert (got - expected).abs().max() == 0


def test_features__normalised_is_layer_norm_without_affine_over_the_channels():
    teacher = _teacher()
    imgs = torch.randn(2, 3, 16, 16)
    raw = _target(teacher, normalize=False)(imgs)
    got = _target(teacher, normalize=True)(imgs)
    assert (got - F.layer_norm(raw, (24,))).abs().max() == 0
    assert got.mean(-1).abs().max() < 1e-5 and (got.var(-1, unbiased=False) - 1).abs().max() < 1e-3


def test_features__a_teacher_of_larger_patches_sees_the_image_resized_to_the_students_grid():
    teacher = _teacher(patch_size=8, img_size=32)  # 4x4 grid at 32 px; the student: 4-px patches at 16 px
    target = _target(teacher, normalize=False)
    imgs = torch.randn(2, 3, 16, 16)
    resized = F.interpolate(imgs, size=(32, 32), mode="bicubic", align_corners=False, antialias=True)
    with torch.no_grad():
        x = F.conv2d(resized, teacher.patch_embed.proj.weight, teacher.patch_embed.proj.bias, stride=8)
        x = (
            torch.cat([teacher.cls_token.expand(2, -1, -1), x.flatten(2).transpose(1, 2)], 1)
            + teacher.pos_embed
        )
        expected = teacher.blocks(x)[:, 1:]
    assert (target(imgs) - expected).abs().max() == 0


def test_features__the_teacher_is_not_in_the_students_state_dict_and_stays_frozen():
    teacher = _teacher()
    before = {k: v.clone() for k, v in teacher.state_dict().items()}
    pixel = build_mae(**TINY, target="pixel")
    options = dict(dim=24, block=-1, normalize=True, teacher=IDENTITY)
    student = build_mae(**TINY, target="features", target_options=options)
    teacher.train()  # set_teacher puts it in eval mode, and keeps it there through the student's train()
    student.target.set_teacher(teacher, student.grid_size)
    assert list(student.state_dict()) == list(pixel.state_dict())
    assert [name for name, _ in student.named_parameters()] == [name for name, _ in pixel.named_parameters()]
    assert not {id(p) for p in teacher.parameters()} & {id(p) for p in student.parameters()}
    assert student.decoder_pred.out_features == 24
    student.train()
    optimizer = torch.optim.AdamW(student.parameters(), lr=1e-2)
    imgs = torch.randn(2, 3, 32, 32)
    loss, pred, mask = student(imgs)
    assert torch.equal(loss, masked_patch_mse(pred, student.target(imgs), mask))
    loss.backward()
    optimizer.step()
    assert not teacher.training
    assert all(p.grad is None and not p.requires_grad for p in teacher.parameters())
    assert all((teacher.state_dict()[k] == v).all() for k, v in before.items())
    assert student.config["target_options"] == options


def test_features__the_teacher_follows_the_images_device_and_dtype():
    target = _target(_teacher())
    assert target(torch.randn(1, 3, 16, 16, dtype=torch.bfloat16)).dtype == torch.bfloat16
    assert next(target.teacher.parameters()).dtype == torch.bfloat16


def test_features__without_a_teacher_it_is_built_but_refuses_to_compute_naming_the_key():
    target = build_target("features", 4, 3, dict(dim=24, teacher=IDENTITY))  # as load_mae rebuilds it
    with pytest.raises(ConfigError, match=r"teacher /runs/teacher.ckpt, which is not loaded.*model.teacher"):
        target(torch.randn(1, 3, 16, 16))


def test_features__no_width_is_refused_naming_the_key():
    with pytest.raises(ConfigError, match="no teacher is named: set model.teacher.checkpoint"):
        build_target("features", 4, 3)


def test_features__options_of_another_target_are_refused_naming_them():
    with pytest.raises(ConfigError, match="model.target hog takes the target_options none; got dim"):
        build_target("hog", 4, 3, dict(dim=24))


@pytest.mark.parametrize("block", [3, -4])
def test_features__a_block_out_of_range_is_refused_naming_the_teachers_depth(block):
    with pytest.raises(ConfigError, match=rf"model.teacher.block {block} .* depth 3: choose 0 to 2"):
        _target(_teacher(), block=block)


def test_features__a_teacher_whose_grid_cannot_map_is_refused_naming_both_grids():
    teacher = _teacher()
    teacher.patch_embed.proj = torch.nn.Conv2d(3, 24, kernel_size=6, stride=4)  # overlapping: 3x3 at 16 px
    with pytest.raises(
        ConfigError, match=r"model.teacher.checkpoint .* cannot map onto the student's 4x4 grid"
    ):
        _target(teacher)


def test_features__another_width_is_refused_naming_both():
    with pytest.raises(
        ConfigError, match="gives tokens of width 24, but this model's decoder_pred predicts 32"
    ):
        FeaturesTarget(4, 3, dim=32).set_teacher(_teacher(), (4, 4))
