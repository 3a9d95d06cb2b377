"""Issue 24, items 2, 13 and 16, through the real commands: links that cannot be followed are skipped
by name (folder module, shard tool, statistics); ``--overwrite`` deletes exactly what an earlier
conversion wrote, locally and on S3, and refuses anything else; an output inside the dataset folder
is refused; each conversion has its own litdata cache; file names (newlines, not UTF-8) are data.
A conversion SIGKILLed part-way (locally or on S3) is an unfinished conversion of the tool's own, which
the same command with ``--overwrite`` replaces, as the data module and the tool both say."""

import contextlib
import json
import os
import re
import shutil
import signal
import subprocess
import time
from pathlib import Path

import boto3
import numpy as np
import pytest
from PIL import Image

from mae.cli.main import invoke
from mae.data.sources.shard_format import read_metadata
from mae.data.tools import shard_destination
from mae.io import storage
from tests.helpers import TINY_MODEL, run_mae, start_mae, write_config, write_image_folder
from tests.integration.streaming.test_streaming import s3  # noqa: F401  (the moto S3 server fixture)

FAST = ("--workers", "1", "--start-method", "fork")  # fork: no re-import per worker


def shard_cli(src: Path, out: str, *extra: str, env: dict | None = None) -> subprocess.CompletedProcess:
    """``mae shard SRC --out OUT`` as a user runs it (not raising on failure)."""
    return run_mae("shard", str(src), "--out", out, *FAST, *extra, check=False, env=env)


def shard_here(src: Path, out: str, *extra: str) -> dict:
    """The same conversion in this process, for setting up a destination."""
    return invoke("shard", [str(src), "--out", out, *FAST, *extra])


@pytest.fixture(scope="module")
def images(tmp_path_factory) -> Path:
    """train: 2 classes x 4 JPEGs; val: 2 x 1."""
    root = tmp_path_factory.mktemp("images")
    write_image_folder(root / "train", ["cat", "dog"], per_class=4, size=(20, 20))
    write_image_folder(root / "val", ["cat", "dog"], per_class=1, size=(20, 20), seed=1)
    return root


def unfollowable_links(root: Path) -> Path:
    """``root/train``: 2 classes x 3 JPEGs, ``cat/loop.jpg -> loop.jpg`` and a
    dangling ``dog/dangling.jpg``."""
    write_image_folder(root / "train", ["cat", "dog"], per_class=3, size=(20, 20))
    os.symlink("loop.jpg", root / "train" / "cat" / "loop.jpg")  # ELOOP when followed
    os.symlink("missing.jpg", root / "train" / "dog" / "dangling.jpg")
    return root


# ---------------------------------------------------------------- links that cannot be followed


def test_shard__a_looping_or_dangling_link_is_skipped_by_name(tmp_path):
    src = unfollowable_links(tmp_path / "src")
    os.symlink("lost", src / "train" / "lost")  # a looping class folder
    result = shard_cli(src, str(tmp_path / "out"))
    assert result.returncode == 0, result.stderr[-3000:]
    assert "skipping unreadable image" in result.stderr and "loop.jpg" in result.stderr
    assert "Too many levels of symbolic links" in result.stderr and "dangling.jpg" in result.stderr
    assert "train/lost" in result.stderr  # the class-level loop is named too
    assert "train: 6 images in 2 classes" in result.stdout and "2 unreadable file(s) skipped" in result.stdout


def test_stats__a_looping_or_dangling_link_is_skipped_by_name(tmp_path):
    src = unfollowable_links(tmp_path / "src")
    result = run_mae("stats", str(src), check=False)
    assert result.returncode == 0, result.stderr[-3000:]
    assert "# 6 images" in result.stdout
    assert "loop.jpg" in result.stderr and "dangling.jpg" in result.stderr


def test_train__a_looping_or_dangling_link_is_skipped_by_name(tmp_path):
    src = unfollowable_links(tmp_path / "src")
    data = {
        "class_path": "mae.data.ImageFolderDataModule",
        "init_args": {"root": str(src), "img_size": 16, "batch_size": 4, "num_workers": 0},
    }
    trainer = {
        "max_epochs": 2,
        "accelerator": "cpu",
        "devices": 1,
        "logger": False,
        "enable_progress_bar": False,
        "default_root_dir": str(tmp_path / "runs"),
    }
    config = write_config(
        tmp_path, {"seed_everything": 0, "model": TINY_MODEL, "data": data, "trainer": trainer}, "c"
    )
    result = run_mae("pretrain", "--config", str(config), check=False)
    assert result.returncode == 0, result.stderr[-3000:]
    assert "skipping unreadable image" in result.stderr
    assert "loop.jpg" in result.stderr and "dangling.jpg" in result.stderr


# ---------------------------------------------------------------- names are data


def test_shard__file_names_with_newlines_are_data(tmp_path):
    """The only grayscale file has a newline in its name, the only RGBA one U+2028: both are the
    examples the kinds notes carry into the metadata, and both are stored under their names; a name
    that is not UTF-8 is stored with its invalid byte shown as ``\\xff``."""
    src = tmp_path / "src"
    write_image_folder(src / "train", ["cat", "dog"], per_class=2, size=(20, 20))
    gray, rgba = "cat/a\nb.png", "dog/c\u2028d.png"
    Image.fromarray(np.zeros((20, 20), np.uint8)).save(src / "train" / gray)
    Image.fromarray(np.zeros((20, 20, 4), np.uint8)).save(src / "train" / rgba)
    not_utf8 = (src / "train" / "cat" / "img_000.jpg").read_bytes()
    os.rename(
        src / "train" / "cat" / "img_000.jpg", os.fsencode(src / "train" / "cat") + b"/not_utf8_\xff.jpg"
    )
    result = shard_cli(src, str(tmp_path / "out"))
    assert result.returncode == 0, result.stderr[-3000:]
    metadata = read_metadata(str(tmp_path / "out"))
    examples = {
        (c, dtype): Path(name).relative_to(src / "train").as_posix() for c, dtype, name in metadata["kinds"]
    }
    assert examples[(1, "uint8")] == gray and examples[(4, "uint8")] == rgba
    from litdata import StreamingDataset

    stored = StreamingDataset(str(tmp_path / "out" / "train"))
    samples = {s["name"]: bytes(s["image"]) for s in (stored[i] for i in range(len(stored)))}
    assert samples[gray] == (src / "train" / gray).read_bytes()
    assert samples[rgba] == (src / "train" / rgba).read_bytes()
    assert samples["cat/not_utf8_\\xff.jpg"] == not_utf8


# ---------------------------------------------------------------- overwrite deletes only its own files


def local_files(folder: Path) -> dict[str, bytes]:
    return {
        p.relative_to(folder).as_posix(): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()
    }


def written_by(folder: Path) -> set[str]:
    """What a finished conversion says it wrote: metadata, each split's index and the chunks it lists."""
    metadata = json.loads((folder / "mae_shards.json").read_text())
    files = {"mae_shards.json"}
    for split in metadata["splits"]:
        index = json.loads((folder / split / "index.json").read_text())
        files |= {f"{split}/index.json"} | {f"{split}/{c['filename']}" for c in index["chunks"]}
    return files


def test_overwrite__refuses_other_files_locally_naming_them_then_replaces_exactly_its_own(images, tmp_path):
    out = tmp_path / "out"
    shard_here(images, str(out), "--chunk-bytes", "2KB")  # several chunks per split
    (out / "train" / "mine.bin").write_bytes(b"the user's own")  # litdata's local overwrite deletes *.bin
    (out / "notes.txt").write_text("keep me")
    before = local_files(out)
    refused = shard_cli(images, str(out), "--overwrite")
    assert refused.returncode != 0
    assert "no conversion of this tool wrote there" in refused.stderr
    assert "train/mine.bin" in refused.stderr and "notes.txt" in refused.stderr
    assert "--overwrite" not in refused.stderr.splitlines()[-1]  # overwrite would refuse too
    assert local_files(out) == before  # nothing deleted

    (out / "train" / "mine.bin").unlink()
    (out / "notes.txt").unlink()
    old = set(local_files(out))
    shard_here(images, str(out), "--overwrite")  # default chunk size: one chunk per split
    # no old chunk is left
    assert set(local_files(out)) == written_by(out) and len(old) > len(written_by(out))


def test_overwrite__clears_an_interrupted_conversion_but_not_files_it_did_not_write(
    images, tmp_path, monkeypatch
):
    import mae.data.tools.shard as shard_module

    out = tmp_path / "out"
    shard_here(images, str(out))
    real_write_split = shard_module.write_split

    def killed_after_the_first_split(samples, split_out, *args):
        real_write_split(samples, split_out, *args)
        raise KeyboardInterrupt  # the new train split is written, the val split and metadata are not

    monkeypatch.setattr(shard_module, "write_split", killed_after_the_first_split)
    with pytest.raises(KeyboardInterrupt):
        shard_here(images, str(out), "--overwrite", "--chunk-bytes", "2KB")
    monkeypatch.setattr(shard_module, "write_split", real_write_split)
    with pytest.raises(FileNotFoundError, match="unfinished conversion"):
        read_metadata(str(out))
    (out / "val").mkdir(exist_ok=True)
    (out / "val" / "photo.jpg").write_bytes(b"not written by the interrupted conversion")
    with pytest.raises(FileExistsError, match=r"1 file\(s\) that no conversion .*val/photo\.jpg"):
        shard_here(images, str(out), "--overwrite")
    (out / "val" / "photo.jpg").unlink()
    shard_here(images, str(out), "--overwrite")
    assert set(local_files(out)) == written_by(out)


# ---------------------------------------------------------------- a conversion killed part-way

# One shard per image, so that a kill lands while the chunks are being written or uploaded.
SMALL_CHUNKS = ("--chunk-bytes", "2KB")


@pytest.fixture(scope="module")
def killable(tmp_path_factory) -> tuple[Path, list[str]]:
    """(train: 2 classes x 8 JPEGs, val: 2 x 2; what a clean conversion of it in shards of one
    image stores, relative to OUT)."""
    root = tmp_path_factory.mktemp("killable")
    write_image_folder(root / "train", ["cat", "dog"], per_class=8, size=(20, 20))
    write_image_folder(root / "val", ["cat", "dog"], per_class=2, size=(20, 20), seed=1)
    clean = tmp_path_factory.mktemp("clean") / "out"
    shard_here(root, str(clean), *SMALL_CHUNKS)
    return root, storage.list_files(str(clean))


def kill_mid_conversion(src: Path, out: str, moment: str, tmp: Path) -> list[str]:
    """Start ``mae shard SRC --out OUT`` as the leader of a process group (a forked command,
    ``tests.forked_commands``), SIGKILL the whole group (litdata's workers too) as soon as a file matching
    ``moment`` is stored under OUT, and return what the kill left there. Its TMPDIR, where the kill leaves
    its workspace, is ``tmp``."""
    tmp.mkdir()
    command = ("shard", str(src), "--out", out, *FAST, *SMALL_CHUNKS)
    with start_mae(*command, env={**os.environ, "TMPDIR": str(tmp)}, new_session=True) as proc:
        deadline = time.monotonic() + 300
        try:
            while not any(re.fullmatch(moment, f) for f in storage.list_files(out)):
                assert proc.poll() is None, (
                    f"the conversion ended before writing {moment}:\n{proc.stderr()[-3000:]}"
                )
                assert time.monotonic() < deadline, (
                    f"no {moment} under {out} after 300 s:\n{proc.stderr()[-3000:]}"
                )
                time.sleep(0.005)
        finally:
            with contextlib.suppress(ProcessLookupError):  # none left of the group
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(60)
    assert proc.returncode == -signal.SIGKILL
    left = storage.list_files(out)
    assert left and "mae_shards.json" not in left  # killed part-way
    return left


def check_the_rerun_with_overwrite_completes(src: Path, out: str, clean: list[str]) -> None:
    """After a kill: the data module and the tool both say "an unfinished conversion; rerun with
    --overwrite", and that rerun replaces it, leaving exactly what a clean conversion stores."""
    left = storage.list_files(out)
    with pytest.raises(
        FileNotFoundError, match=r"unfinished conversion of mae shard.*IMAGE_FOLDER .* --overwrite"
    ):
        read_metadata(out)
    refused = shard_cli(src, out, *SMALL_CHUNKS)
    assert refused.returncode != 0
    last = refused.stderr.strip().splitlines()[-1]
    assert "unfinished conversion" in last and "pass --overwrite" in last, refused.stderr[-3000:]
    assert storage.list_files(out) == left
    rerun = shard_cli(src, out, *SMALL_CHUNKS, "--overwrite")
    assert rerun.returncode == 0, f"left by the kill: {left}\n{rerun.stderr[-3000:]}"
    assert storage.list_files(out) == clean  # no stray chunk, worker index or temporary file
    assert read_metadata(out)["splits"]["train"]["images"] == 16


@pytest.mark.parametrize(
    "moment",
    [
        r".+",  # the first file: the conversion's record (or its temporary file)
        r"train/chunk-\d+-\d+\.bin",  # while the first split's shards are written
        r"train/\d+\.index\.json",  # a worker's index, before litdata merges it into index.json
        r"val/chunk-\d+-\d+\.bin",  # while the second split's shards are written
    ],
)
def test_killed_conversion__locally_the_rerun_with_overwrite_completes(killable, tmp_path, moment):
    src, clean = killable
    out = str(tmp_path / "out")
    kill_mid_conversion(src, out, moment, tmp_path / "tmp")
    check_the_rerun_with_overwrite_completes(src, out, clean)


@pytest.mark.parametrize(
    ("prefix", "moment"),
    [
        # while the first split's shards are uploaded (uploads are whole objects: no other moment differs on
        # S3; the local moments above cover the rest of the conversion)
        ("first-split", r"train/chunk-\d+-\d+\.bin"),
    ],
)
def test_killed_conversion__on_s3_the_rerun_with_overwrite_completes(
    s3,  # noqa: F811
    killable,
    tmp_path,
    prefix,
    moment,
):
    src, clean = killable
    out = f"s3://shards/killed-{prefix}"
    kill_mid_conversion(src, out, moment, tmp_path / "tmp")
    check_the_rerun_with_overwrite_completes(src, out, clean)


@pytest.mark.parametrize("content", ["", "record"])
def test_killed_conversion__before_its_record_was_renamed_the_rerun_with_overwrite_completes(
    killable, tmp_path, content
):
    """A kill inside the first write (the record's temporary file created, empty or written, not
    yet renamed) leaves only that temporary file: the conversion's own by its content."""
    src, clean = killable
    out = tmp_path / "out"
    out.mkdir()
    record = {"format": "mae-shards", "files": [], "splits": ["train", "val"]}
    (out / ".mae_shards.partial.json.tmp-4242").write_text(json.dumps(record, indent=1) if content else "")
    check_the_rerun_with_overwrite_completes(src, str(out), clean)


def test_killed_conversion__a_users_file_named_like_a_records_temporary_is_still_refused(killable, tmp_path):
    src, _ = killable
    out = tmp_path / "out"
    out.mkdir()
    (out / ".mae_shards.partial.json.tmp-7").write_text("my own notes")
    with pytest.raises(FileExistsError, match=r"1 file\(s\) that no conversion of this tool wrote there"):
        shard_here(src, str(out), "--overwrite")
    assert storage.list_files(str(out)) == [".mae_shards.partial.json.tmp-7"]
    with pytest.raises(FileNotFoundError, match=r"no record of an unfinished conversion") as refused:
        read_metadata(str(out))
    assert "--overwrite" not in str(refused.value)  # the tool would refuse it


def test_killed_conversion__the_next_one_removes_its_workspace_and_nothing_else(
    killable, tmp_path, monkeypatch
):
    """A SIGKILLed conversion cannot remove its workspace in TMPDIR, nor its cache folder in the folder
    chosen with litdata's variable: the next conversion removes both, by the owner record the killed one
    wrote. A folder named like a workspace without that record, one of another machine and the workspace
    of a conversion that still runs stay."""
    src, clean = killable
    tmp, caches = tmp_path / "tmp", tmp_path / "caches"
    monkeypatch.setenv("DATA_OPTIMIZER_CACHE_FOLDER", str(caches))
    out = str(tmp_path / "out")
    kill_mid_conversion(src, out, r"train/chunk-\d+-\d+\.bin", tmp)
    (killed,) = tmp.glob("mae-shard-*")
    assert [p.name.startswith("mae-shard-chunks-") for p in caches.iterdir()] == [True]
    (tmp / "mae-shard-foo").mkdir()
    (tmp / "mae-shard-foo" / "notes.txt").write_text("not a workspace")
    running = tmp / "mae-shard-running"
    running.mkdir()
    shard_destination._write_owner(str(running), [])  # this test's process, alive
    elsewhere = shutil.copytree(killed, tmp / "mae-shard-elsewhere")
    record = json.loads((elsewhere / shard_destination.OWNER_RECORD).read_text())
    (elsewhere / shard_destination.OWNER_RECORD).write_text(json.dumps({**record, "machine": "another host"}))

    rerun = shard_cli(src, out, *SMALL_CHUNKS, "--overwrite", env={**os.environ, "TMPDIR": str(tmp)})
    assert rerun.returncode == 0, rerun.stderr[-3000:]
    assert storage.list_files(out) == clean
    assert sorted(p.name for p in tmp.glob("mae-shard-*")) == [
        "mae-shard-elsewhere",
        "mae-shard-foo",
        "mae-shard-running",
    ]
    assert (tmp / "mae-shard-foo" / "notes.txt").read_text() == "not a workspace"
    assert list(caches.iterdir()) == []


def test_output_inside_the_dataset_folder__refused(tmp_path):
    src = write_image_folder(tmp_path / "src" / "train", ["cat", "dog"], per_class=2, size=(20, 20)).parent
    result = shard_cli(src, str(src / "train" / "shards"))
    assert result.returncode != 0
    assert "inside the dataset folder" in result.stderr and "choose a folder outside" in result.stderr
    assert not (src / "train" / "shards").exists()


def s3_keys(prefix: str) -> dict[str, bytes]:
    client = boto3.client("s3")
    listing = client.list_objects_v2(Bucket="shards", Prefix=prefix).get("Contents", [])
    return {o["Key"]: client.get_object(Bucket="shards", Key=o["Key"])["Body"].read() for o in listing}


def test_overwrite__on_s3_refuses_the_users_objects_then_replaces_exactly_its_own(s3, images):  # noqa: F811
    client = boto3.client("s3")
    shard_here(images, "s3://shards/own", "--chunk-bytes", "2KB")
    client.put_object(Bucket="shards", Key="own/train/photo.jpg", Body=b"the user's own")
    client.put_object(Bucket="shards", Key="own/val/chunk-9-9.bin", Body=b"also the user's")
    client.put_object(Bucket="shards", Key="own-other/keep.txt", Body=b"another prefix")
    before = s3_keys("own")
    refused = shard_cli(images, "s3://shards/own", "--overwrite")
    assert refused.returncode != 0
    assert "train/photo.jpg" in refused.stderr and "val/chunk-9-9.bin" in refused.stderr
    assert "--overwrite" not in refused.stderr.splitlines()[-1]
    assert s3_keys("own") == before  # nothing deleted, the other prefix included

    client.delete_objects(
        Bucket="shards",
        Delete={"Objects": [{"Key": "own/train/photo.jpg"}, {"Key": "own/val/chunk-9-9.bin"}]},
    )
    old = set(s3_keys("own/"))
    shard_here(images, "s3://shards/own", "--overwrite")  # default chunk size: one chunk per split
    metadata = json.loads(client.get_object(Bucket="shards", Key="own/mae_shards.json")["Body"].read())
    expected = {"own/mae_shards.json"}
    for split in metadata["splits"]:
        index = json.loads(client.get_object(Bucket="shards", Key=f"own/{split}/index.json")["Body"].read())
        expected |= {f"own/{split}/index.json"} | {f"own/{split}/{c['filename']}" for c in index["chunks"]}
    assert set(s3_keys("own/")) == expected and len(old) > len(expected)  # no old chunk is left
    assert "own-other/keep.txt" in s3_keys("own-other/")


def test_shard__each_conversion_has_its_own_litdata_cache_and_removes_it(s3, images, tmp_path):  # noqa: F811
    """litdata empties TMPDIR/chunks and TMPDIR/data when a conversion starts: another conversion's
    files there must survive, and nothing of ours stays behind."""
    tmp = tmp_path / "tmp"
    for cache in ("chunks", "data"):
        (tmp / cache).mkdir(parents=True)
        (tmp / cache / "another-conversion.bin").write_bytes(b"in use")
    result = shard_cli(images, "s3://shards/private", env={**os.environ, "TMPDIR": str(tmp)})
    assert result.returncode == 0, result.stderr[-3000:]
    for cache in ("chunks", "data"):
        assert [p.name for p in (tmp / cache).iterdir()] == ["another-conversion.bin"]
    assert not list(tmp.glob("mae-shard-*"))


def test_listing__a_training_folder_without_class_folders_says_the_layout(tmp_path):
    from mae.data import ImageFolderDataModule

    (tmp_path / "train").mkdir()
    (tmp_path / "train" / "loose.jpg").write_bytes(b"not in a class folder")
    with pytest.raises(
        FileNotFoundError, match=r"no class folder in .*train: expected .*train/<class>/<image>"
    ):
        ImageFolderDataModule(str(tmp_path)).setup()
