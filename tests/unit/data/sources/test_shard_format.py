"""The shard folders' record (``mae.data.sources.shard_format``): a record of this format, the temporary file
a kill leaves before its rename, an unfinished conversion, and ``mae_shards.json`` read and checked, each
refusal naming what the folder looks like and the command that fixes it (local folders here; S3:
tests/integration/streaming)."""

import json

import pytest

from mae.data.sources.shard_format import (
    FORMAT,
    METADATA,
    PARTIAL,
    VERSION,
    is_record,
    is_record_temporary,
    read_metadata,
    unfinished_conversion,
)

RECORD = {"format": FORMAT, "version": VERSION, "splits": {"train": "train"}}


def test_record__this_format_only_and_its_temporary_by_name_and_content():
    assert is_record(RECORD) and not is_record({"format": "other"}) and not is_record([FORMAT])
    name = f".{METADATA}.tmp-1234"
    assert is_record_temporary(name, json.dumps(RECORD))
    assert is_record_temporary(f".{PARTIAL}.tmp-7", "")  # killed between creating and writing it
    assert not is_record_temporary(name, '{"format": "mine"}')  # a user's file of that name
    assert not is_record_temporary(name, "{not json")
    assert not is_record_temporary(name, None)
    assert not is_record_temporary(f"{METADATA}.tmp-1234", json.dumps(RECORD))  # not atomic_write's name


def test_unfinished_conversion__its_partial_record_or_the_temporary_of_its_first_write(tmp_path):
    assert not unfinished_conversion(str(tmp_path))
    (tmp_path / f".{PARTIAL}.tmp-3").write_text("")
    assert unfinished_conversion(str(tmp_path))
    (tmp_path / f".{PARTIAL}.tmp-3").unlink()
    (tmp_path / PARTIAL).write_text(json.dumps({**RECORD, "files": []}))
    assert unfinished_conversion(str(tmp_path))
    (tmp_path / PARTIAL).write_text("not json")
    assert not unfinished_conversion(str(tmp_path))


def test_read_metadata__the_checked_record_or_what_the_folder_is_and_the_command_that_fixes_it(tmp_path):
    root = str(tmp_path / "shards")
    with pytest.raises(
        FileNotFoundError, match=f"no shard folder at data.root={root} .*mae shard IMAGE_FOLDER"
    ):
        read_metadata(root)
    (tmp_path / "shards").mkdir()
    (tmp_path / "shards" / "index.json").write_text("{}")
    with pytest.raises(FileNotFoundError, match=f"is a litdata folder without {METADATA}"):
        read_metadata(root)
    (tmp_path / "shards" / "index.json").unlink()
    (tmp_path / "shards" / PARTIAL).write_text(json.dumps(RECORD))
    with pytest.raises(FileNotFoundError, match="holds an unfinished conversion of mae shard.*--overwrite"):
        read_metadata(root)
    (tmp_path / "shards" / PARTIAL).write_text(json.dumps({"format": "other"}))
    with pytest.raises(
        FileNotFoundError, match=f"has no {METADATA} and no record of an unfinished conversion"
    ):
        read_metadata(root)
    (tmp_path / "shards" / METADATA).write_text(json.dumps({**RECORD, "version": VERSION + 1}))
    with pytest.raises(ValueError, match=f"is format '{FORMAT}' version {VERSION + 1}; this code reads"):
        read_metadata(root)
    (tmp_path / "shards" / METADATA).write_text(json.dumps(RECORD))
    assert read_metadata(root) == RECORD
