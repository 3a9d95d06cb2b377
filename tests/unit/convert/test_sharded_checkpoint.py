"""Sharded checkpoint folders (what ``--config strategy/fsdp`` writes) read by one process: the same dict as
the run's ``.ckpt`` file, in every loader, and never code from the files."""

import os
import pickle
from pathlib import Path

import pytest
import torch
import torch.distributed.checkpoint as dcp

from mae.convert.backbone import load_backbone
from mae.convert.sharded_checkpoint import (
    META_FILE,
    SHARDS_METADATA,
    is_sharded_checkpoint,
    read_metadata,
    read_sharded_checkpoint,
    read_training_checkpoint,
)
from mae.errors import InputError
from mae.training.checkpointing import AtomicCheckpointIO, remove_orphan_temporaries
from tests.helpers import call_pickle, tiny_pretraining_checkpoint


def _by_name(optimizer_state: dict) -> dict:
    """An index-keyed optimizer state keyed by (made-up) parameter names, as a sharded save keys it."""
    name = lambda index: f"model.param_{index:03d}"  # noqa: E731
    return {
        "state": {name(i): value for i, value in optimizer_state["state"].items()},
        "param_groups": [
            {**g, "params": [name(i) for i in g["params"]]} for g in optimizer_state["param_groups"]
        ],
    }


def write_sharded(file: Path, folder: Path) -> dict:
    """The training checkpoint ``file`` as the sharded folder one process saves; returns the file's dict."""
    checkpoint = torch.load(file, weights_only=True)
    shards = {
        "state_dict": checkpoint["state_dict"],
        "optimizer_0": _by_name(checkpoint["optimizer_states"][0]),
    }
    dcp.save(shards, checkpoint_id=folder, no_dist=True)
    rest = {k: v for k, v in checkpoint.items() if k not in ("state_dict", "optimizer_states")}
    torch.save(rest, folder / META_FILE)
    return checkpoint


@pytest.fixture(scope="module")
def sharded(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("sharded")
    file = tiny_pretraining_checkpoint(tmp)
    folder = tmp / "sharded" / "last.ckpt"
    return file, folder, write_sharded(file, folder)


def test_sharded_folder__reads_as_the_runs_checkpoint_file_in_every_loader(sharded):
    file, folder, expected = sharded
    assert is_sharded_checkpoint(folder) and not is_sharded_checkpoint(file)
    for read in (
        read_sharded_checkpoint(folder),
        read_training_checkpoint(folder),
        AtomicCheckpointIO().load_checkpoint(folder),
    ):
        assert sorted(read) == sorted(expected)
        assert read["global_step"] == expected["global_step"]
        for key, value in expected["state_dict"].items():
            assert torch.equal(read["state_dict"][key], value), key
        got, want = read["optimizer_states"][0], expected["optimizer_states"][0]
        assert [g["params"] for g in got["param_groups"]] == [g["params"] for g in want["param_groups"]]
        for index, moments in want["state"].items():
            for name, value in moments.items():
                assert torch.equal(got["state"][index][name], value), (index, name)
    weights = read_sharded_checkpoint(folder, model_only=True)
    assert "optimizer_states" not in weights and sorted(weights["state_dict"]) == sorted(
        expected["state_dict"]
    )
    from_folder, from_file = load_backbone(folder), load_backbone(file)
    assert from_folder.load_report.format == "lightning"
    for key, value in from_file.state_dict().items():
        assert torch.equal(from_folder.state_dict()[key], value), key


class _RunsCode:
    def __reduce__(self):
        return (os.system, ("touch ran_code",))


def test_sharded_folder__an_index_that_would_run_code_is_refused_before_it_runs(
    sharded, tmp_path, monkeypatch
):
    _, folder, _ = sharded
    hostile = tmp_path / "hostile.ckpt"
    hostile.mkdir()
    for path in folder.iterdir():
        (hostile / path.name).write_bytes(path.read_bytes())
    (hostile / SHARDS_METADATA).write_bytes(pickle.dumps(_RunsCode()))
    monkeypatch.chdir(tmp_path)
    with pytest.raises(
        InputError, match=rf"{SHARDS_METADATA} would run code when loaded \(GLOBAL posix\.system\)"
    ):
        read_sharded_checkpoint(hostile)
    with pytest.raises(InputError, match="would run code"):
        load_backbone(hostile)
    assert not (tmp_path / "ran_code").exists()


def test_sharded_folder__an_entry_that_would_run_code_is_refused_before_it_runs(tmp_path, monkeypatch):
    folder = tmp_path / "hostile.ckpt"
    groups = [{"params": ["model.w"], "lr": _RunsCode()}]
    dcp.save(
        {"state_dict": {"model.w": torch.zeros(2)}, "optimizer_0": {"state": {}, "param_groups": groups}},
        checkpoint_id=folder,
        no_dist=True,
    )
    torch.save({"global_step": 1}, folder / META_FILE)
    monkeypatch.chdir(tmp_path)
    with pytest.raises(
        InputError, match=r"hostile\.ckpt: the entry optimizer_0\.param_groups\.0\.lr would run code when "
    ):
        read_sharded_checkpoint(folder)
    assert not (tmp_path / "ran_code").exists()


def test_sharded_folder__a_truncated_shard_is_named(sharded, tmp_path):
    _, folder, _ = sharded
    damaged = tmp_path / "damaged.ckpt"
    damaged.mkdir()
    for path in folder.iterdir():
        data = path.read_bytes()
        (damaged / path.name).write_bytes(data[: len(data) // 2] if path.suffix == ".distcp" else data)
    with pytest.raises(
        InputError, match=rf"could not read the sharded checkpoint {damaged}: a shard is missing"
    ):
        read_sharded_checkpoint(damaged)


def test_orphan_temporaries__a_killed_sharded_save_leaves_no_folder_behind(tmp_path):
    orphan = tmp_path / ".last.ckpt.tmp-999999999"  # no such process
    (orphan / "sub").mkdir(parents=True)
    (orphan / "__0_0.distcp").write_bytes(b"x")
    (tmp_path / "last.ckpt").mkdir()
    assert remove_orphan_temporaries(tmp_path) == [orphan]
    assert [p.name for p in tmp_path.iterdir()] == ["last.ckpt"]


def test_sharded_folder__an_index_naming_a_shard_outside_its_folder_is_refused(sharded, tmp_path):
    _, folder, _ = sharded
    hostile = tmp_path / "escape.ckpt"
    hostile.mkdir()
    for path in folder.iterdir():
        (hostile / path.name).write_bytes(path.read_bytes())
    metadata = read_metadata(hostile)
    for info in metadata.storage_data.values():
        info.relative_path = "../../outside.distcp"
    (hostile / SHARDS_METADATA).write_bytes(pickle.dumps(metadata))
    with pytest.raises(InputError, match=r"names a shard outside its folder \(\.\./\.\./outside\.distcp\)"):
        read_sharded_checkpoint(hostile)


@pytest.mark.slow  # a forked mae pretrain
def test_resume__a_folder_that_is_not_a_sharded_checkpoint_is_named(tmp_path):
    from tests.helpers import run_mae

    (tmp_path / "last.ckpt").mkdir()  # e.g. shards copied without their index
    result = run_mae(
        "pretrain", "--config", "default", "--ckpt_path", str(tmp_path / "last.ckpt"), check=False
    )
    assert result.returncode == 2
    assert result.stderr.strip().splitlines()[-1] == (
        f"error: --ckpt_path {tmp_path / 'last.ckpt'} is a folder but not a sharded checkpoint (one holds "
        "meta.pt, .metadata and a .distcp file per process); give the .ckpt file or checkpoint folder a run "
        "wrote"
    )


METADATA_MODULE = "torch.distributed.checkpoint.metadata"  # the module of the index's classes; imports os
# (module, name, what the call would create): each reaches a function through an allowed module or name.
BYPASSES = {
    "os.mkdir through the metadata module": (METADATA_MODULE, "os.mkdir"),
    "os.makedirs through the metadata module": (METADATA_MODULE, "os.makedirs"),
    "os.system through the metadata module": (METADATA_MODULE, "os.system"),
    "a dotted path through an allowed class": (METADATA_MODULE, "Metadata.__init__.__globals__.get"),
    "os.mkdir through torch": ("torch", "os.mkdir"),
    "builtins.eval": ("builtins", "eval"),
    "builtins.exec": ("builtins", "exec"),
    "os.mkdir itself": ("os", "mkdir"),
    "a name of the metadata module that is not a record": (METADATA_MODULE, "os"),
}


def _payload_args(module: str, name: str, target: Path) -> tuple[str, ...]:
    """What the call is given, so that running it would create ``target``."""
    if name.endswith(("system",)):
        return (f"mkdir {target}",)
    if name in ("eval", "exec"):
        return (f"__import__('os').mkdir({str(target)!r})",)
    return (str(target),)


def _forged(sharded_folder: Path, folder: Path, index: bytes) -> Path:
    """A copy of ``sharded_folder`` at ``folder`` whose ``.metadata`` is ``index``."""
    folder.mkdir()
    for path in sharded_folder.iterdir():
        (folder / path.name).write_bytes(path.read_bytes())
    (folder / SHARDS_METADATA).write_bytes(index)
    return folder


@pytest.mark.parametrize("stack_global", [True, False], ids=["STACK_GLOBAL", "GLOBAL"])
@pytest.mark.parametrize("bypass", list(BYPASSES))
def test_sharded_folder__an_index_reaching_a_function_through_an_allowed_name_runs_nothing(
    sharded, tmp_path, bypass, stack_global
):
    _, folder, _ = sharded
    module, name = BYPASSES[bypass]
    target = tmp_path / "created_by_the_index"
    index = call_pickle(module, name, _payload_args(module, name, target), stack_global)
    hostile = _forged(folder, tmp_path / "hostile.ckpt", index)
    with pytest.raises(InputError, match=rf"{SHARDS_METADATA} would run code when loaded \(GLOBAL "):
        read_metadata(hostile)
    with pytest.raises(InputError, match="would run code when loaded"):
        read_sharded_checkpoint(hostile)
    with pytest.raises(InputError, match="would run code when loaded"):
        load_backbone(hostile)
    assert not target.exists()


def test_sharded_folder__mae_export_of_a_forged_index_runs_nothing(sharded, tmp_path):
    from tests.helpers import run_mae

    _, folder, _ = sharded
    target = tmp_path / "created_by_the_index"
    index = call_pickle(METADATA_MODULE, "os.mkdir", (str(target),), stack_global=True)
    hostile = _forged(folder, tmp_path / "hostile.ckpt", index)
    out = tmp_path / "encoder.safetensors"
    result = run_mae("export", "--checkpoint", str(hostile), "--out", str(out), check=False)
    assert result.returncode == 2, result.stderr
    refused = f"error: {hostile / SHARDS_METADATA} would run code when loaded (GLOBAL {METADATA_MODULE}.os."
    assert result.stderr.strip().splitlines()[-1].startswith(refused + "mkdir)")
    assert not target.exists() and not out.exists()


def test_sharded_folder__the_index_of_a_real_save_names_only_allowed_objects(sharded):
    _, folder, _ = sharded
    metadata = read_metadata(folder)  # every name of a real index is allowed
    assert metadata.state_dict_metadata and metadata.storage_data
