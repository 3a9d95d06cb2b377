"""The distillation student (``mae.models.student``): a headless timm ViT initialised as TinyMIM's students,
with frozen sin-cos position embeddings; names that are no ViT refused."""

import pytest
import torch

from mae.errors import ConfigError
from mae.models.pos_embed import sincos_2d
from mae.models.student import create_student


def test_create_student__a_headless_timm_vit_with_fixed_sincos_positions():
    torch.manual_seed(0)
    student = create_student("vit_small_patch16_224", 32, 1, patch_size=4, embed_dim=64, depth=2, num_heads=2)
    assert type(student).__name__ == "VisionTransformer" and student.num_classes == 0
    assert student.patch_embed.proj.in_channels == 1 and tuple(student.patch_embed.grid_size) == (8, 8)
    torch.testing.assert_close(student.pos_embed[0], sincos_2d(64, (8, 8)))
    assert not student.pos_embed.requires_grad
    assert all(b.abs().sum() == 0 for n, b in student.named_parameters() if n.endswith("qkv.bias"))
    assert student(torch.randn(2, 1, 32, 32)).shape == (2, 64)


@pytest.mark.parametrize(
    "name, message",
    [
        ("vit_tiny_patch16_2244", "model.student 'vit_tiny_patch16_2244' is not a timm model name"),
        ("resnet18", "model.student 'resnet18' is not a timm VisionTransformer"),
    ],
)
def test_create_student__refuses_what_is_no_timm_vit(name, message):
    with pytest.raises(ConfigError, match=message):
        create_student(name, 32, 3)


def test_create_student__an_argument_timm_does_not_take_is_named():
    with pytest.raises(ConfigError, match="model.student_kwargs: .*depht"):
        create_student("vit_tiny_patch16_224", 32, 3, depht=2)
