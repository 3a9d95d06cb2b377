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


def test_embed_files__feature_blocks_are_read_recorded_and_searched_with(tmp_path, capsys):
    """``--feature-blocks 0 -1`` of a two-block encoder: each vector is the two blocks' cls tokens side by
    side (``pooled``), the index records the blocks, and a search embeds its queries from the same blocks
    (an image's copy scores 1); an index written before blocks existed reads as the last block."""
    import json

    import torch

    from mae.apps.embeddings.embedder import load_embedder
    from mae.apps.embeddings.image_search import index_embedder, search_images
    from mae.convert.pooling import pooled
    from tests.helpers import TWO_BLOCK_KWARGS

    checkpoint = tiny_pretraining_checkpoint(tmp_path / "ckpt", model_kwargs=TWO_BLOCK_KWARGS)
    root = write_image_folder(tmp_path / "root", ["a", "b"], per_class=2, size=(16, 16))
    out = tmp_path / "index.npy"
    settings = EmbedSettings(
        [str(root)], checkpoint, out, feature_blocks=[-1, 0], workers=0, no_progress=True
    )
    meta = embed_files(settings)
    assert meta.feature_blocks == [0, 1] and meta.dim == 2 * 32
    assert "(cls pooling of blocks 0, 1, input 16x16)" in capsys.readouterr().out

    plain = load_embedder(checkpoint)
    files = sorted(root.rglob("*.jpg"))
    imgs = torch.stack([plain.load(f) for f in files])
    with torch.no_grad():
        expected = torch.cat([pooled(plain.encoder, "cls", [b])(imgs) for b in (0, 1)], dim=1)
    index = EmbeddingIndex(out)
    vectors = torch.cat([chunk for _, chunk in index.vector_chunks(100)])
    assert torch.allclose(vectors, expected, atol=1e-5)

    embedder = index_embedder(index)
    assert embedder.blocks == [0, 1]
    matches, _ = search_images(index, embedder, [files[2]], k=1)
    assert matches[0].neighbours[0].score == pytest.approx(1.0, abs=1e-5)

    record = json.loads((tmp_path / "index.json").read_text())
    del record["feature_blocks"]  # as every index before 0.4.0 was written
    (tmp_path / "index.json").write_text(json.dumps(record))
    assert EmbeddingIndex(out).meta.feature_blocks is None
