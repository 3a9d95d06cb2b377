"""The atomic-write helpers (``mae.io.atomic``): the one free-space rule, a file written whole or not at
all, and a folder put in place only once it is whole (the sharded checkpoints' save)."""

import shutil
from collections import namedtuple

import pytest

from mae.io import atomic
from mae.io.atomic import NoSpaceError, atomic_write, check_free_space, replace_folder

Usage = namedtuple("Usage", "total used free")


@pytest.fixture
def free_bytes(monkeypatch):
    """Every device has 1,000 bytes free."""
    monkeypatch.setattr(atomic.shutil, "disk_usage", lambda path: Usage(10_000, 9_000, 1_000))


def test_check_free_space__refuses_what_does_not_fit_naming_the_path_and_the_bytes(tmp_path, free_bytes):
    check_free_space(tmp_path / "new" / "a.ckpt", 1_000)  # fits: nothing raised, the folder made
    check_free_space(tmp_path / "new" / "a.ckpt", None)  # size not known: nothing checked
    assert (tmp_path / "new").is_dir()
    with pytest.raises(
        NoSpaceError, match=r"could not write .*a\.ckpt: it needs about 1,001 bytes and .* 1,000"
    ):
        check_free_space(tmp_path / "new" / "a.ckpt", 1_001)


@pytest.mark.parametrize(
    "present, words", [("file", "(the previous file there is intact)"), ("folder", "(the previous folder")]
)
def test_check_free_space__says_what_is_at_the_path_is_intact(tmp_path, free_bytes, present, words):
    target = tmp_path / "last.ckpt"
    target.mkdir() if present == "folder" else target.write_text("old")
    with pytest.raises(NoSpaceError) as refused:
        check_free_space(target, 5_000)
    assert words in str(refused.value)


def test_atomic_write__a_file_too_large_for_the_device_is_never_started(tmp_path, free_bytes):
    target = tmp_path / "x.bin"
    target.write_bytes(b"old")
    written = []
    with pytest.raises(NoSpaceError, match=r"\(the previous file there is intact\)"):
        atomic_write(target, written.append, size=2_000)
    assert not written and target.read_bytes() == b"old" and [p.name for p in tmp_path.iterdir()] == ["x.bin"]


def test_atomic_write__a_failed_write_leaves_the_previous_file_and_no_temporary(tmp_path):
    target = tmp_path / "x.bin"
    atomic_write(target, lambda tmp: tmp.write_bytes(b"first"))

    def fail(tmp):
        tmp.write_bytes(b"half")
        raise PermissionError(13, "Permission denied")

    with pytest.raises(OSError, match=r"could not write .*x\.bin \(the previous file there is intact\)"):
        atomic_write(target, fail)
    assert target.read_bytes() == b"first" and [p.name for p in tmp_path.iterdir()] == ["x.bin"]


@pytest.mark.parametrize("present", ["nothing", "file", "folder"])
def test_replace_folder__puts_the_new_folder_in_place_of_what_was_there(tmp_path, present):
    new, target = tmp_path / ".last.ckpt.tmp-1", tmp_path / "last.ckpt"
    new.mkdir()
    (new / "shard_0").write_text("new")
    if present == "file":
        target.write_text("old")
    elif present == "folder":
        target.mkdir()
        (target / "shard_0").write_text("old")
    replace_folder(new, target)
    assert (target / "shard_0").read_text() == "new"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["last.ckpt"]  # the old folder removed


@pytest.mark.parametrize("present", ["file", "folder"])
def test_replace_folder__a_file_takes_the_place_of_what_was_there(tmp_path, present):
    """A one-process checkpoint file over a sharded folder, or over an earlier file."""
    new, target = tmp_path / ".last.ckpt.file.tmp-1", tmp_path / "last.ckpt"
    new.write_text("new")
    if present == "folder":
        target.mkdir()
        (target / "shard_0").write_text("old")
    else:
        target.write_text("old")
    replace_folder(new, target)
    assert target.read_text() == "new"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["last.ckpt"]


def test_replace_folder__a_failed_rename_leaves_an_old_file_aside_not_lost(tmp_path):
    target = tmp_path / "last.ckpt"
    target.write_text("old")
    with pytest.raises(FileNotFoundError):
        replace_folder(tmp_path / "missing", target)
    (aside,) = [p for p in tmp_path.iterdir() if p.name.startswith(".last.ckpt.old.tmp-")]
    assert aside.read_text() == "old"


def test_replace_folder__a_failed_rename_leaves_the_old_folder_aside_not_lost(tmp_path, monkeypatch):
    target = tmp_path / "last.ckpt"
    target.mkdir()
    (target / "shard_0").write_text("old")
    with pytest.raises(FileNotFoundError):
        replace_folder(tmp_path / "missing", target)
    (aside,) = [p for p in tmp_path.iterdir() if p.name.startswith(".last.ckpt.old.tmp-")]
    assert (aside / "shard_0").read_text() == "old"
    shutil.rmtree(aside)
