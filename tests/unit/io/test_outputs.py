"""Every command's outputs, checked before any work by one rule (``mae.io.outputs``): a command replaces
only what a run of its own wrote; a user's file at an output path, an output inside an input, a folder
where a file is meant (or the reverse) and a path below a file are refused with ``error: ...`` naming the
path, exit status 2, and the user's files are left byte for byte. Run through the real command lines."""

import os
import shutil
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

import mae.cli.anomaly  # noqa: F401  imported here, the forked commands start with it (tests.forked_commands)
import mae.cli.embed  # noqa: F401
import mae.cli.export  # noqa: F401
import mae.cli.reconstruct  # noqa: F401
import mae.cli.search  # noqa: F401
from tests.helpers import run_mae, tiny_pretraining_checkpoint


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory) -> Path:
    return tiny_pretraining_checkpoint(tmp_path_factory.mktemp("ckpt"))


@pytest.fixture
def images(tmp_path) -> Path:
    """A folder of four 16x16 RGB PNGs (two classes)."""
    rng = np.random.default_rng(0)
    for name in ("a/0.png", "a/1.png", "b/0.png", "b/1.png"):
        (tmp_path / "images" / name).parent.mkdir(parents=True, exist_ok=True)
        Image.fromarray(rng.integers(0, 256, (16, 16, 3), dtype=np.uint8)).save(tmp_path / "images" / name)
    return tmp_path / "images"


def refused(result, *fragments: str) -> None:
    """The command ended with its own error (exit 2, no traceback) naming every fragment."""
    assert result.returncode == 2, result.stdout[-2000:] + result.stderr[-2000:]
    assert "Traceback" not in result.stderr, result.stderr[-3000:]
    last = result.stderr.strip().splitlines()[-1]
    assert last.startswith("error: "), last
    for fragment in fragments:
        assert fragment in last, (fragment, last)


def snapshot(folder: Path) -> dict[str, bytes]:
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


def embed(checkpoint, *args):
    return run_mae(
        "embed", "--checkpoint", str(checkpoint), "--workers", "0", "--no-progress", *args, check=False
    )


def reconstruct(checkpoint, image, out):
    return run_mae("reconstruct", "--checkpoint", str(checkpoint), str(image), "--out", str(out), check=False)


def anomaly_without_a_checkpoint(images, out, tmp_path):
    """``mae anomaly`` of the test folder ``images`` into ``out``, naming a checkpoint that does not exist
    (whatever is refused is refused before it loads)."""
    checkpoint = str(tmp_path / "missing.ckpt")
    argv = ("--checkpoint", checkpoint, "--test", str(images), "--raw-errors", "--out", str(out))
    return run_mae("anomaly", *argv, check=False)


def test_embed__the_users_files_beside_an_index_are_refused_and_kept(checkpoint, images, tmp_path):
    users = tmp_path / "users"
    users.mkdir()
    (users / "data.csv").write_text("the user's table\n")
    (users / "data.json").write_text('{"the user": "settings"}\n')
    (users / "table.parquet").write_bytes(b"PAR1 not an index PAR1")
    (users / "index.parquet.parts").mkdir()
    (users / "index.parquet.parts" / "notes.txt").write_text("my notes\n")
    before = snapshot(users)
    refused(
        embed(checkpoint, str(images), "--out", str(users / "data.npy")), str(users / "data.csv"), "mae embed"
    )
    refused(
        embed(checkpoint, str(images), "--out", str(users / "table.parquet")), str(users / "table.parquet")
    )
    refused(
        embed(checkpoint, str(images), "--out", str(users / "index.parquet")),
        "index.parquet.parts",
        "notes.txt",
    )
    assert snapshot(users) == before


def test_embed__its_own_index_is_replaced_and_its_parts_folder_reused(checkpoint, images, tmp_path):
    for out in (tmp_path / "out" / "index.npy", tmp_path / "out" / "index.parquet"):
        for _ in range(2):  # the second run replaces the first's files
            result = embed(checkpoint, str(images), "--out", str(out))
            assert result.returncode == 0, result.stderr[-2000:]
        assert not out.with_name(out.name + ".parts").exists()
    # a kill between the index's files leaves its record and CSV without the vectors: still its own
    (tmp_path / "out" / "index.npy").unlink()
    result = embed(checkpoint, str(images), "--out", str(tmp_path / "out" / "index.npy"))
    assert result.returncode == 0, result.stderr[-2000:]
    # a kill leaves the parts folder: it is the command's own, so the next run goes on
    parts = tmp_path / "out" / "again.npy.parts"
    parts.mkdir()
    (parts / "manifest.json").write_text("{}")
    (parts / "part-000000.npz").write_bytes(b"")
    result = embed(checkpoint, str(images), "--out", str(tmp_path / "out" / "again.npy"))
    assert result.returncode == 0, result.stderr[-2000:]
    assert not parts.exists()


def test_outputs__inside_an_input_a_folder_for_a_file_or_below_a_file(checkpoint, images, tmp_path):
    refused(
        embed(checkpoint, str(images), "--out", str(images / "index.npy")), "inside the input", str(images)
    )
    (tmp_path / "folder.npy").mkdir()
    refused(embed(checkpoint, str(images), "--out", str(tmp_path / "folder.npy")), "is a folder")
    (tmp_path / "a_file").write_text("x")
    refused(
        embed(checkpoint, str(images), "--out", str(tmp_path / "a_file" / "index.npy")), "is not a folder"
    )
    (tmp_path / "figure.png").mkdir()
    refused(
        reconstruct(checkpoint, images / "a", tmp_path / "figure.png"),
        "is a folder",
    )
    (tmp_path / "encoder.onnx").mkdir()
    refused(
        run_mae(
            "export", "--checkpoint", str(checkpoint), "--out", str(tmp_path / "encoder.onnx"), check=False
        ),
        "is a folder",
    )
    refused(
        run_mae("export", "--checkpoint", str(checkpoint), "--out", str(checkpoint), check=False),
        "--out must end in",
    )
    refused(
        anomaly_without_a_checkpoint(images, tmp_path / "a_file", tmp_path),
        "is a file",
    )


def test_reconstruct__replaces_its_own_figure_never_the_users_image(checkpoint, images, tmp_path):
    out = tmp_path / "figure.png"
    for _ in range(2):
        result = reconstruct(checkpoint, images / "a", out)
        assert result.returncode == 0, result.stderr[-2000:]
    photo = tmp_path / "photo.png"
    shutil.copy(images / "b" / "0.png", photo)
    before = photo.read_bytes()
    refused(
        reconstruct(checkpoint, images / "a", photo),
        str(photo),
        "mae reconstruct",
    )
    assert photo.read_bytes() == before


def test_search__replaces_its_own_figure_never_the_users_image(checkpoint, images, tmp_path):
    embed(checkpoint, str(images), "--out", str(tmp_path / "index.npy"))
    search = (
        "search",
        "--index",
        str(tmp_path / "index.npy"),
        str(images / "a" / "0.png"),
        "--device",
        "cpu",
    )
    for _ in range(2):
        result = run_mae(*search, "--out", str(tmp_path / "grid.png"), check=False)
        assert result.returncode == 0, result.stderr[-2000:]
    photo = tmp_path / "photo.png"
    shutil.copy(images / "b" / "0.png", photo)
    refused(run_mae(*search, "--out", str(photo), check=False), str(photo), "mae search")
    assert photo.read_bytes() == (images / "b" / "0.png").read_bytes()


def test_export__the_users_json_beside_the_weights_is_refused(checkpoint, tmp_path):
    (tmp_path / "encoder.json").write_text('{"mine": true}\n')
    refused(
        run_mae(
            "export",
            "--checkpoint",
            str(checkpoint),
            "--out",
            str(tmp_path / "encoder.safetensors"),
            check=False,
        ),
        str(tmp_path / "encoder.json"),
    )
    assert (tmp_path / "encoder.json").read_text() == '{"mine": true}\n'
    assert not (tmp_path / "encoder.safetensors").exists()
    for _ in range(2):  # its own export is replaced
        result = run_mae(
            "export", "--checkpoint", str(checkpoint), "--out", str(tmp_path / "own.safetensors"), check=False
        )
        assert result.returncode == 0, result.stderr[-2000:]


def test_anomaly__an_output_inside_the_test_folder_is_refused_before_the_model_loads(images, tmp_path):
    """Run twice, the second run scored the first's heat maps as a defect class; the checkpoint named here
    does not exist, so the refusal comes before anything is loaded or read."""
    result = anomaly_without_a_checkpoint(images, images / "results", tmp_path)
    refused(result, "--out", "inside the input")
    assert not (images / "results").exists()
    (tmp_path / "mine").mkdir()
    (tmp_path / "mine" / "scores.csv").write_text("my scores\n")
    result = anomaly_without_a_checkpoint(images, tmp_path / "mine", tmp_path)
    refused(result, "scores.csv", "no run of mae anomaly wrote")


@pytest.mark.skipif(os.geteuid() != 0, reason="drops to user nobody in a forked child (needs root)")
def test_outputs__a_folder_the_user_cannot_write_is_refused_up_front():
    """Root writes anywhere, so the check runs in a forked child that became user nobody."""
    import tempfile

    from mae.io.outputs import Output, OutputError, check_outputs

    with tempfile.TemporaryDirectory() as top:
        os.chmod(top, 0o777)  # nobody may write here, not in the folders below
        locked = Path(top) / "locked"
        locked.mkdir(mode=0o555)
        private = Path(top) / "private"
        private.mkdir(mode=0o700)
        read, write = os.pipe()
        pid = os.fork()
        if pid == 0:  # the child: nobody, then the check
            os.close(read)
            os.setgid(65534)
            os.setuid(65534)
            messages = []
            cases = [
                Output(locked / "sub" / "figure.png", "--out"),  # below a read-only folder
                Output(locked, "--out", kind="folder"),  # an existing read-only output folder
                Output(private / "sub" / "figure.png", "--out"),
            ]  # below a folder it may not look into
            for case in cases:
                try:
                    check_outputs("mae.reconstruct", [case])
                    messages.append("no error")
                except OutputError as err:
                    messages.append(str(err))
            os.write(write, "\n".join(messages).encode())
            os._exit(0)
        os.close(write)
        with os.fdopen(read, "rb") as pipe:
            messages = pipe.read().decode().split("\n")
        os.waitpid(pid, 0)
    assert messages[0].startswith(f"--out {locked}/sub/figure.png: {locked} is not writable"), messages
    assert messages[1].startswith(f"--out {locked} is not writable by this user"), messages
    assert messages[2].startswith(f"--out {private}/sub/figure.png: cannot look at"), messages
