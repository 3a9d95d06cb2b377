"""Sharded checkpoint folders as a format (``mae.convert.formats.sharded``): recognised by their index and
``meta.pt``, read as the run's Lightning checkpoint (its model weights only); a folder missing one of them
is refused naming it."""

import pytest
import torch

from mae.convert.formats import sharded
from mae.convert.formats.base import CheckpointPath
from mae.convert.sharded_checkpoint import META_FILE, SHARDS_METADATA
from mae.convert.sources import read_checkpoint
from mae.errors import InputError
from tests.helpers import tiny_pretraining_checkpoint
from tests.unit.convert.test_sharded_checkpoint import write_sharded


def test_sharded_folder__detected_and_read_as_the_runs_checkpoint(tmp_path):
    file = tiny_pretraining_checkpoint(tmp_path)
    folder = tmp_path / "sharded" / "last.ckpt"
    write_sharded(file, folder)
    assert sharded.detect(CheckpointPath(folder))
    assert not sharded.detect(CheckpointPath(file)) and not sharded.detect(CheckpointPath(tmp_path))
    ckpt, expected = sharded.read(CheckpointPath(folder)), read_checkpoint(file)
    assert ckpt.format == "lightning" and ckpt.config == expected.config and ckpt.data == expected.data
    assert ckpt.state_dict.keys() == expected.state_dict.keys()
    assert all(torch.equal(ckpt.state_dict[k], v) for k, v in expected.state_dict.items())


@pytest.mark.parametrize("removed", [META_FILE, SHARDS_METADATA])
def test_sharded_folder__missing_one_of_its_files_is_refused_naming_it(tmp_path, removed):
    folder = tmp_path / "sharded" / "last.ckpt"
    write_sharded(tiny_pretraining_checkpoint(tmp_path), folder)
    (folder / removed).unlink()
    assert sharded.detect(CheckpointPath(folder))
    with pytest.raises(
        InputError, match=rf"is a sharded checkpoint folder \(1 \.distcp .* missing {removed}"
    ):
        read_checkpoint(folder)
