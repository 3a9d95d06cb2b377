"""Where the shard converter may write (``mae.data.tools.shard_destination``), on a local folder: the files
an earlier conversion wrote, by its records, and the refusals that keep a user's own files (S3, and kills
part-way: tests/integration/streaming/test_shard_safety.py)."""

import json

import pytest

from mae.data.sources.shard_format import FORMAT, METADATA, PARTIAL, VERSION
from mae.data.tools.shard_destination import check_destination, conversion_files


def _finished(out):
    """A finished conversion's files: its record, a split's index and the chunk that index lists."""
    (out / "train").mkdir(parents=True)
    (out / METADATA).write_text(
        json.dumps({"format": FORMAT, "version": VERSION, "split_folders": ["train"]})
    )
    (out / "train" / "index.json").write_text(json.dumps({"chunks": [{"filename": "chunk-0-0.bin"}]}))
    (out / "train" / "chunk-0-0.bin").write_bytes(b"shard")
    return out


def test_conversion_files__a_finished_conversion_owns_its_record_index_and_listed_chunks(tmp_path):
    out = _finished(tmp_path / "out")
    (out / "train" / "chunk-0-1.bin").write_bytes(b"not listed")
    (out / "mine.txt").write_text("the user's")
    stored, owned = conversion_files(str(out), None)
    assert sorted(stored) == sorted(
        [METADATA, "mine.txt", "train/chunk-0-0.bin", "train/chunk-0-1.bin", "train/index.json"]
    )
    assert owned == {METADATA, "train/index.json", "train/chunk-0-0.bin"}


def test_conversion_files__an_unfinished_one_owns_the_litdata_files_of_the_splits_it_was_writing(tmp_path):
    out = tmp_path / "out"
    (out / "val").mkdir(parents=True)
    (out / PARTIAL).write_text(json.dumps({"format": FORMAT, "splits": ["val"], "files": ["old.json"]}))
    for name in ("val/chunk-1-0.bin", "val/0.index.json", "val/photo.jpg", "old.json"):
        (out / name).write_bytes(b"x")
    _, owned = conversion_files(str(out), None)
    assert owned == {PARTIAL, "val/chunk-1-0.bin", "val/0.index.json", "old.json"}


def test_check_destination__refuses_foreign_files_an_earlier_conversion_without_overwrite_and_a_nested_output(
    tmp_path,
):
    images = tmp_path / "images"
    images.mkdir()
    assert check_destination(images, str(tmp_path / "new"), False, None) == []
    out = _finished(tmp_path / "out")
    with pytest.raises(FileExistsError, match="the 3 file\\(s\\) of an earlier conversion.*--overwrite"):
        check_destination(images, str(out), False, None)
    assert sorted(check_destination(images, str(out), True, None)) == sorted(
        [METADATA, "train/chunk-0-0.bin", "train/index.json"]
    )
    (out / "mine.txt").write_text("the user's")
    with pytest.raises(
        FileExistsError,
        match="holds 1 file\\(s\\) that no conversion of this tool wrote there \\(mine.txt\\)",
    ):
        check_destination(images, str(out), True, None)
    with pytest.raises(ValueError, match="is inside the dataset folder"):
        check_destination(images, str(images / "shards"), False, None)
    with pytest.raises(FileExistsError, match="is a file"):
        check_destination(images, str(out / "mine.txt"), True, None)
