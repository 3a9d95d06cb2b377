"""The recipes' views (``mae.data.views.recipes``): the official pretraining recipe."""

from mae.data import pretrain_transform
from mae.data.views.crop import PretrainCrop


def test_pretrain_transform__official_recipe():
    crop = pretrain_transform(224)
    assert isinstance(crop, PretrainCrop)
    assert crop.size == (224, 224) and crop.scale == (0.2, 1.0) and crop.ratio == (3 / 4, 4 / 3)
