import pickle

import pytest
import torch

from mae.convert.sharded_checkpoint import META_FILE, SHARDS_METADATA
from mae.errors import OutputExistsError
from mae.training.checkpointing import AtomicCheckpointIO


def test_atomic_save__replaces_the_file_and_leaves_no_temporary(tmp_path):
    io = AtomicCheckpointIO()
    path = tmp_path / "ckpts" / "last.ckpt"
    io.save_checkpoint({"step": 1}, path)
    io.save_checkpoint({"step": 2}, path)
    assert torch.load(path, weights_only=True) == {"step": 2}
    assert [p.name for p in path.parent.iterdir()] == ["last.ckpt"]


def test_atomic_save__a_failed_save_keeps_the_previous_checkpoint(tmp_path):
    io = AtomicCheckpointIO()
    path = tmp_path / "last.ckpt"
    io.save_checkpoint({"step": 1}, path)
    with pytest.raises((pickle.PicklingError, AttributeError)):
        io.save_checkpoint({"step": 2, "bad": lambda: None}, path)  # lambdas cannot be pickled
    assert torch.load(path, weights_only=True) == {"step": 1}
    assert [p.name for p in tmp_path.iterdir()] == ["last.ckpt"]


def _sharded_folder(path):
    """A folder as a sharded save leaves it (what ``is_sharded_checkpoint`` looks for, and a shard)."""
    path.mkdir(parents=True)
    for name in (META_FILE, SHARDS_METADATA, "__0_0.distcp"):
        (path / name).write_bytes(b"shard")
    return path


def test_atomic_save__a_sharded_checkpoint_folder_there_is_replaced_by_the_file(tmp_path):
    """A run under FSDP2 resumed by one process: its ``last.ckpt`` folder becomes the one process's file."""
    path = _sharded_folder(tmp_path / "last.ckpt")
    AtomicCheckpointIO().save_checkpoint({"step": 2}, path)
    assert torch.load(path, weights_only=True) == {"step": 2}
    assert [p.name for p in tmp_path.iterdir()] == ["last.ckpt"]  # no temporary, no folder set aside


def test_atomic_save__a_folder_that_is_no_checkpoint_is_refused_and_kept(tmp_path):
    path = tmp_path / "last.ckpt"
    path.mkdir()
    (path / "notes.txt").write_text("mine")
    with pytest.raises(OutputExistsError, match=rf"cannot write the checkpoint {path}: a folder that is not"):
        AtomicCheckpointIO().save_checkpoint({"step": 2}, path)
    assert (path / "notes.txt").read_text() == "mine"
    assert [p.name for p in tmp_path.iterdir()] == ["last.ckpt"]
