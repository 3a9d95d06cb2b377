"""The digit scenes' images as pretraining data (``mae.data.sources.scene_images``): unlabelled, both
splits, written on first use and refused for anything but RGB."""

import pytest
import torch

from mae.data import DigitSceneImagesDataModule
from mae.data.sources.scene_images import SceneImages


def test_scene_images__the_training_and_validation_scenes_unlabelled(tmp_path):
    data = DigitSceneImagesDataModule(
        root=str(tmp_path / "scenes"), num_train=3, num_val=2, canvas=32, img_size=32, batch_size=2
    )
    data.setup("fit")  # writes the scenes on first use
    assert (tmp_path / "scenes" / "scenes.json").is_file() and data.num_labels == 1
    assert (len(data.train_set), len(data.val_set)) == (3, 2)
    imgs, labels = next(iter(data.val_dataloader()))
    assert imgs.shape == (2, 3, 32, 32) and labels.tolist() == [0, 0]
    assert imgs.dtype == torch.float32 and imgs.std() > 0.1  # normalised scenes, not a blank canvas


def test_scene_images__an_unwritten_split_or_other_channels_are_refused(tmp_path):
    with pytest.raises(FileNotFoundError, match="no scene images in .*images/train: write them"):
        SceneImages(tmp_path, "train", transform=lambda image: image)
    with pytest.raises(ValueError, match="the digit scenes are RGB images: data.in_chans must be 3, got 1"):
        DigitSceneImagesDataModule(
            root=str(tmp_path), num_train=1, num_val=1, canvas=32, in_chans=1, mean=[0.5], std=[0.5]
        ).setup("fit")
