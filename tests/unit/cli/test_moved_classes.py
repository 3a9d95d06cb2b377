"""``mae.cli.moved_classes``: a class path of a moved module (``mae.training.settings.MOVES``) found in a
config, and the class's path now."""

import importlib

import pytest

from mae.cli.moved_classes import moved_class_error, moved_class_paths, new_class_path
from mae.errors import ConfigError
from mae.training.settings import MOVED_MODULES, present_modules


@pytest.mark.parametrize("old", sorted(MOVED_MODULES))
def test_moves__every_old_module_has_a_home_that_imports_and_no_longer_imports_itself(old):
    for module in present_modules(old):
        importlib.import_module(module)
        assert module not in MOVED_MODULES
    with pytest.raises(ModuleNotFoundError):
        importlib.import_module(old)


@pytest.mark.parametrize(
    "old, new",
    [
        ("mae.dense.scene_images.DigitSceneImagesDataModule", "mae.data.DigitSceneImagesDataModule"),
        ("mae.dense.detection_data.DigitScenesDataModule", "mae.dense.DigitScenesDataModule"),
        ("mae.dense.figures.PredictionFigures", "mae.dense.PredictionFigures"),
        # moved in 0.2.0, then again in 0.4.0
        ("mae.eval.onnx_encoder.OnnxEncoder", "mae.convert.onnx_encoder.OnnxEncoder"),
    ],
)
def test_new_class_path__the_shortest_path_of_the_same_class(old, new):
    assert new_class_path(old) == new


def test_moved_class_paths__found_at_any_depth_and_named_by_key():
    old = "mae.dense.scene_images.DigitSceneImagesDataModule"
    config = {
        "data": {"class_path": old, "init_args": {"root": "x"}},
        "trainer": {"callbacks": [{"class_path": "mae.data.ImageFolderDataModule"}, "mae.dense.figures.X"]},
    }
    assert list(moved_class_paths(config)) == [
        ("data.class_path", old),
        ("trainer.callbacks[1]", "mae.dense.figures.X"),
    ]
    assert list(moved_class_paths({"data": {"class_path": "mae.data.ImageFolderDataModule"}})) == []


def test_moved_class_error__a_class_no_new_module_holds_names_where_its_module_went():
    error = moved_class_error("--config old.yaml", "data.class_path", "mae.dense.figures.Nope")
    assert isinstance(error, ConfigError)
    assert str(error) == (
        "--config old.yaml: data.class_path mae.dense.figures.Nope: its module mae.dense.figures was moved "
        "to mae.dense.tasks.figures in 0.2.0, which holds no Nope; name a class there (CHANGELOG.md lists "
        "the moved modules)"
    )
