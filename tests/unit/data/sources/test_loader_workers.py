"""The loader settings (``SplitLoaders``) and the digit scenes' parameters (``DigitScenesOnDisk``), each
defined once: every data module family (images, detection, segmentation) has the same keys, defaults and
checks, and the three digit-scene modules the same scene parameters, as a config file reads them."""

import pytest
from jsonargparse import ArgumentParser
from lightning.pytorch import LightningDataModule

from mae.data import CIFARDataModule, DigitSceneImagesDataModule, DigitsDataModule, ImageFolderDataModule
from mae.data.sources.digit_scenes import DigitScenesOnDisk
from mae.data.sources.loader_workers import MainProcessLoading, SplitLoaders
from mae.data.sources.streaming import StreamingDataModule
from mae.dense.data import (
    DetectionDataModule,
    DigitScenesDataModule,
    DigitScenesSegmentation,
    SegmentationDataModule,
)
from mae.errors import ConfigError

# A data module of each family and source, built with its required arguments only.
FAMILIES = {
    "folder": lambda **kw: ImageFolderDataModule("data/none", **kw),
    "cifar": lambda **kw: CIFARDataModule("data/none", **kw),
    "shards": lambda **kw: StreamingDataModule("data/none", **kw),
    "detection": lambda **kw: DetectionDataModule("data/none", **kw),
    "segmentation": lambda **kw: SegmentationDataModule("data/none", num_classes=3, **kw),
}
BUILT_IN = {
    "digits": DigitsDataModule,
    "scene images": DigitSceneImagesDataModule,
    "scene detection": DigitScenesDataModule,
    "scene segmentation": DigitScenesSegmentation,
}
SCENE_MODULES = (DigitSceneImagesDataModule, DigitScenesDataModule, DigitScenesSegmentation)
LOADER_KEYS = ("batch_size", "num_workers", "pin_memory", "persistent_workers")


def _settings(data: SplitLoaders) -> dict:
    return {key: getattr(data, key) for key in LOADER_KEYS[1:]}


# The settings a config must give these data modules.
REQUIRED = {
    ImageFolderDataModule: ["--data.root", "data"],
    DetectionDataModule: ["--data.root", "data"],
    SegmentationDataModule: ["--data.root", "data", "--data.num_classes", "3"],
}


def _config_defaults(cls: type) -> dict:
    """The ``data.init_args`` defaults of ``cls`` as LightningCLI reads them (jsonargparse's signature)."""
    parser = ArgumentParser(exit_on_error=False)
    parser.add_subclass_arguments(LightningDataModule, "data")
    args = ["--data.class_path", f"{cls.__module__}.{cls.__qualname__}", *REQUIRED.get(cls, [])]
    return dict(vars(parser.parse_args(args).data.init_args))


@pytest.mark.parametrize("family", FAMILIES)
def test_loader_settings__every_family_has_the_same_defaults(family):
    assert _settings(FAMILIES[family]()) == {"num_workers": 8, "pin_memory": True, "persistent_workers": True}


@pytest.mark.parametrize("name", BUILT_IN)
def test_loader_settings__the_built_in_data_loads_in_the_main_process(name):
    data = BUILT_IN[name]()
    assert _settings(data) == {"num_workers": 0, "pin_memory": False, "persistent_workers": False}
    assert isinstance(data, MainProcessLoading)


@pytest.mark.parametrize("family", [*FAMILIES, *BUILT_IN])
@pytest.mark.parametrize(
    ("key", "value", "message"),
    [
        ("batch_size", 0, "data.batch_size must be >= 1, got 0"),
        ("num_workers", -1, "data.num_workers must be >= 0, got -1"),
    ],
)
def test_loader_settings__every_family_refuses_a_bad_value_naming_the_key(family, key, value, message):
    build = FAMILIES.get(family) or BUILT_IN[family]
    with pytest.raises(ConfigError) as refused:
        build(**{key: value})
    assert str(refused.value) == message


@pytest.mark.parametrize(
    "cls", [ImageFolderDataModule, DetectionDataModule, SegmentationDataModule, *BUILT_IN.values()]
)
def test_loader_settings__the_same_config_keys_reach_every_family(cls):
    defaults = _config_defaults(cls)
    assert set(LOADER_KEYS) <= set(defaults)
    main_process = issubclass(cls, MainProcessLoading)
    assert defaults["persistent_workers"] is not main_process
    assert defaults["num_workers"] == (0 if main_process else 8)


def test_loader_settings__segmentation_keeps_workers_by_the_common_rule(tmp_path):
    def persistent(**settings) -> bool:
        data = SegmentationDataModule(tmp_path, num_classes=3, **settings)
        return data._loader([0, 1, 2, 3], train=False).persistent_workers

    assert persistent(num_workers=1)
    assert not persistent(num_workers=1, persistent_workers=False)  # a setting now, no longer always on
    assert not persistent(num_workers=0)


def test_loader_settings__the_batch_size_default_follows_the_image_size():
    batch_sizes = {family: build().batch_size for family, build in FAMILIES.items()}
    assert batch_sizes == {"folder": 64, "cifar": 128, "shards": 64, "detection": 2, "segmentation": 16}


def test_digit_scenes__one_set_of_parameters_for_the_three_modules():
    scene_keys = ("root", "num_train", "num_val", "canvas", "seed", "img_size")
    expected = {key: _config_defaults(SCENE_MODULES[0])[key] for key in scene_keys}
    assert expected == {
        "root": "data/digit_scenes",
        "num_train": 1000,
        "num_val": 200,
        "canvas": 64,
        "seed": 0,
        "img_size": 64,
    }
    for cls in SCENE_MODULES:
        assert issubclass(cls, DigitScenesOnDisk)
        defaults = _config_defaults(cls)
        assert {key: defaults[key] for key in scene_keys} == expected, cls.__name__
        data = cls()
        assert str(data.root) == "data/digit_scenes" and data.img_size == 64
        assert data.scene_kwargs == {"num_train": 1000, "num_val": 200, "canvas": 64, "seed": 0}


def test_digit_scenes__the_fixed_layout_is_no_setting():
    for cls, fixed in [
        (DigitScenesDataModule, {"train_annotations", "val_annotations", "train_images", "val_images"}),
        (DigitScenesSegmentation, {"num_classes", "images", "masks", "train_split", "reduce_zero_label"}),
    ]:
        assert not fixed & set(_config_defaults(cls)), cls.__name__
    data = DigitScenesDataModule(root="somewhere", num_train=3, batch_size=4)
    assert (data.train_annotations, data.train_images, data.batch_size) == (
        "annotations/instances_train.json",
        "images/train",
        4,
    )
