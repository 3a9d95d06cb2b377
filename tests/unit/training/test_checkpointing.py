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


# ---------------------------------------------------------------- resuming a CNN run


def _cnn_checkpoint(path, **model_kwargs):
    """A training checkpoint (state, optimizer states, architecture record) of a SparK resnet10t module."""
    from tests.helpers import pretrain_module

    kwargs = dict(encoder="resnet10t", mask_unit=8, decoder_width=64, **model_kwargs)
    module = pretrain_module(model="spark", img_size=32, model_kwargs=kwargs)
    ckpt = {
        "state_dict": module.state_dict(),
        "optimizer_states": [{}],
        "global_step": 3,
        "mae_architecture": module.architecture_record(),
    }
    torch.save(ckpt, path)
    return path


def test_check_resume__a_cnn_run_resumes_only_with_its_encoder_decoder_and_mask_unit(tmp_path):
    from mae.errors import ConfigError
    from mae.training.checkpointing import check_resume_checkpoint
    from tests.helpers import pretrain_module

    path = _cnn_checkpoint(tmp_path / "last.ckpt")
    same = dict(encoder="resnet10t", mask_unit=8, decoder_width=64)
    assert check_resume_checkpoint(path, pretrain_module(model="spark", img_size=32, model_kwargs=same)) == 3
    other = pretrain_module(model="spark", img_size=32, model_kwargs={**same, "mask_unit": 16})
    refused = (
        rf"^--ckpt_path {path} was written with another CNN model than this config builds: "
        r"model.model_kwargs.mask_unit 8 \(this config: 16\)\. Set them"
    )
    with pytest.raises(ConfigError, match=refused):
        check_resume_checkpoint(path, other)
    with pytest.raises(
        ConfigError, match=rf"^--ckpt_path {path} holds a MaskedAutoencoderCNN and this config "
    ):
        check_resume_checkpoint(path, pretrain_module())
