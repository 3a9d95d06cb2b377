"""A folder's layout rules (``mae.data.sources.layout``): the pixel sample that picks the reading path,
the class folders, the training split and the class selection."""

import os

import numpy as np
import pytest
from PIL import Image

from mae.data.sources.layout import class_folders, sample_pixels, select_classes, train_folder
from tests.helpers import write_image_folder


def test_reading_path__the_folder_sample_applies_the_rule(tmp_path):
    write_image_folder(tmp_path / "rgb", ["a", "b"], 2)
    sample = sample_pixels(tmp_path / "rgb", ["a", "b"])
    assert sample.rgb_readable and not sample.array_path(3) and sample.array_path(1) is True
    assert sample.expected(3) is None  # the RGB path converts any 8-bit mode
    with pytest.raises(ValueError, match="has 3 channel\\(s\\) but data.in_chans is 2"):
        sample.expected(2)
    (tmp_path / "scan" / "a").mkdir(parents=True)
    Image.fromarray(np.zeros((8, 8), np.uint16)).save(tmp_path / "scan" / "a" / "x.png")
    sample = sample_pixels(tmp_path / "scan", ["a"])
    assert (
        sample.array_path(3) and sample.expected(1) == (1, "uint16") and sample.expected(3) == (1, "uint16")
    )


def test_class_folders__sorted_sub_folders_unreadable_entries_skipped_and_named(tmp_path, caplog):
    for name in ("b", "a", "c"):
        (tmp_path / name).mkdir()
    (tmp_path / "notes.txt").write_text("not a class")
    os.symlink(tmp_path / "gone", tmp_path / "dangling")
    with caplog.at_level("WARNING"):
        assert class_folders(tmp_path) == ["a", "b", "c"]
    assert "dangling" in caplog.text and "skipped" in caplog.text
    with pytest.raises(FileNotFoundError, match=f"no class folder in {tmp_path / 'a'}: expected"):
        class_folders(tmp_path / "a")


def test_train_folder__the_split_or_one_error_naming_the_splits_there_are(tmp_path):
    (tmp_path / "train").mkdir()
    (tmp_path / "val").mkdir()
    assert train_folder(tmp_path, "train", "data.train_split") == tmp_path / "train"
    with pytest.raises(
        FileNotFoundError, match=r"has no split 'training'.*\(set --split\); it has train, val"
    ):
        train_folder(tmp_path, "training", "--split")


def test_select_classes__a_class_list_file_or_the_first_or_a_seeded_random_k(tmp_path):
    names = ["a", "b", "c", "d", "e"]
    assert select_classes(names) is None  # all classes
    assert select_classes(names, num_classes=2) == ["a", "b"]
    picked = select_classes(names, num_classes=3, selection="random", seed=1)
    assert picked == sorted(picked) and len(set(picked)) == 3
    assert picked == select_classes(names, num_classes=3, selection="random", seed=1)
    (tmp_path / "list.txt").write_text("# wanted\nc\n\n e  # the last\n")
    assert select_classes(names, class_list=tmp_path / "list.txt", num_classes=1) == ["c", "e"]
    with pytest.raises(ValueError, match="num_classes=6 but 5 classes are available"):
        select_classes(names, num_classes=6)
    with pytest.raises(ValueError, match="class_selection must be 'first' or 'random', got 'last'"):
        select_classes(names, num_classes=1, selection="last")
    (tmp_path / "empty.txt").write_text("# nothing\n")
    with pytest.raises(ValueError, match="names no classes"):
        select_classes(names, class_list=tmp_path / "empty.txt")
    with pytest.raises(FileNotFoundError, match="missing.txt does not exist \\(the package ships .*\\.txt"):
        select_classes(names, class_list=tmp_path / "missing.txt")
