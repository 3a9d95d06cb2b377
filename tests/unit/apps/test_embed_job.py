"""``mae embed``'s job (``mae.apps.embeddings.embed_job``) called from Python with its settings: the index
written and reported, the checks that come before the encoder is loaded, and the map drawn beside it."""

import pytest

from mae.apps.embeddings.embed_job import EmbedSettings, embed_files
from mae.apps.embeddings.embedding_index import EmbeddingIndex
from mae.errors import UsageError
from tests.helpers import tiny_pretraining_checkpoint, write_image_folder


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    return tiny_pretraining_checkpoint(tmp_path_factory.mktemp("ckpt"))


def test_embed_files__writes_the_index_and_says_what_it_holds(checkpoint, tmp_path, capsys):
    root = write_image_folder(tmp_path / "root", ["a", "b"], per_class=2, size=(20, 16))
    out = tmp_path / "index.npy"
    meta = embed_files(EmbedSettings([str(root)], checkpoint, out, pool="avg", workers=0, no_progress=True))
    assert meta.count == 4 and meta.pool == "avg" and len(EmbeddingIndex(out)) == 4
    assert (
        capsys.readouterr().out == f"wrote {out}: 4 vectors of length {meta.dim} (avg pooling, input 16x16)\n"
    )


def test_embed_files__a_map_of_too_few_images_and_a_part_size_of_0_are_refused_before_any_work(
    checkpoint, tmp_path
):
    root = write_image_folder(tmp_path / "root", ["a"], per_class=2, size=(16, 16))
    settings = EmbedSettings([str(root)], "no-such.ckpt", tmp_path / "index.npy", map=tmp_path / "map.png")
    with pytest.raises(UsageError, match="--map needs at least 3 images to map, got 2"):
        embed_files(settings)  # the checkpoint is never read
    with pytest.raises(UsageError, match="--part-size must be at least 1, got 0"):
        embed_files(EmbedSettings([str(root)], checkpoint, tmp_path / "index.npy", part_size=0))
    assert sorted(p.name for p in tmp_path.iterdir()) == ["root"]
