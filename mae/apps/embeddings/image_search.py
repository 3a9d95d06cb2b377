"""Similar-image search in an embedding index: query images embedded by the index's own encoder (checked
to be the same weights), then exact cosine neighbours (``mae.apps.embeddings.similarity``)."""

import os
from dataclasses import dataclass
from pathlib import Path

import torch

from mae.apps.embeddings.embedder import Embedder, load_embedder, vector_width, weights_fingerprint
from mae.apps.embeddings.embedding_index import EmbeddingIndex
from mae.apps.embeddings.similarity import cosine_top_k
from mae.convert.sources import read_checkpoint
from mae.data import DEFAULT_MAX_PIXELS
from mae.errors import ConfigError, MissingFileError
from mae.inference.images import IMAGE_ERRORS

CHUNK_ROWS = 65536  # index rows compared at a time: 65,536 x 768 float32 = 192 MiB


def index_embedder(
    index: EmbeddingIndex,
    checkpoint: str | os.PathLike | None = None,
    format: str = "auto",
    device: str | torch.device = "cpu",
    max_pixels: int | None = DEFAULT_MAX_PIXELS,
) -> Embedder:
    """The encoder that made ``index``: ``checkpoint`` when given (the same weights in any format), else
    the one the index records; it embeds queries at the index's input size, pooling and normalisation.

    Raises:
        FileNotFoundError: the recorded checkpoint is not here (and none was given).
        ValueError: the checkpoint's vectors have another length than the index's, or its weights are
            not those the index was built with (another model, or a ``last.ckpt`` trained further since).
    """
    meta = index.meta
    if checkpoint is None:
        checkpoint = meta.checkpoint
        if not Path(checkpoint).exists():
            raise MissingFileError(
                f"{index.path} was built with {checkpoint}, which does not exist here: pass "
                "--checkpoint with the same weights (in any format)"
            )
    ckpt = read_checkpoint(checkpoint, format)
    dim = vector_width(ckpt, meta.pool, meta.feature_blocks)
    chosen = meta.feature_blocks
    blocks = "" if chosen is None else f" --feature-blocks {' '.join(map(str, chosen))}"
    rebuild = f"mae embed --checkpoint {checkpoint} --pool {meta.pool}{blocks} ... --out {index.path.name}"
    if dim != meta.dim:
        raise ConfigError(
            f"{index.path} holds vectors of length {meta.dim} ({meta.pool} pooling of "
            f"{meta.checkpoint}) but {checkpoint} gives vectors of length {dim}: search with the "
            f"checkpoint the index was built with, or rebuild the index with this one "
            f"({rebuild})"
        )
    fingerprint = weights_fingerprint(ckpt)
    if fingerprint != meta.fingerprint:
        changed = _same_file(checkpoint, meta.checkpoint)
        since = " (the file was changed since, e.g. by more training)" if changed else ""
        raise ConfigError(
            f"{checkpoint} holds other weights (fingerprint {fingerprint[:12]}) than those "
            f"{index.path} was built with ({meta.checkpoint}, fingerprint {meta.fingerprint[:12]})"
            f"{since}: their vectors are not comparable; search with those weights, or rebuild the "
            f"index ({rebuild})"
        )
    return load_embedder(
        ckpt,
        meta.pool,
        img_size=tuple(meta.img_size),
        norm=meta.norm(),
        device=device,
        max_pixels=max_pixels,
        fingerprint=fingerprint,
        blocks=meta.feature_blocks,
    )


def _same_file(a: str | os.PathLike, b: str | os.PathLike) -> bool:
    return os.path.abspath(a) == os.path.abspath(b)


@dataclass
class Neighbour:
    row: int  # its row in the index
    path: str
    label: str | None
    score: float  # cosine similarity in [-1, 1]


@dataclass
class Match:
    query: str  # the query image's path
    neighbours: list[Neighbour]  # best first


def search_images(
    index: EmbeddingIndex,
    embedder: Embedder,
    paths: list[str | os.PathLike],
    k: int = 8,
    chunk_rows: int = CHUNK_ROWS,
    batch_size: int = 256,
) -> tuple[list[Match], list[tuple[str, str]]]:
    """The ``k`` nearest index rows of each readable image of ``paths``.

    Returns:
        (one ``Match`` per readable query, in order; (path, error) of each query that could not be read).
    """
    imgs, readable, unreadable = [], [], []
    for path in paths:
        try:
            imgs.append(embedder.load(path))
            readable.append(str(path))
        except IMAGE_ERRORS as err:
            unreadable.append((str(path), str(err) or type(err).__name__))
    if not readable:
        return [], unreadable
    queries = torch.cat(
        [embedder(torch.stack(imgs[i : i + batch_size])) for i in range(0, len(imgs), batch_size)]
    )
    scores, rows = cosine_top_k(queries, index.vector_chunks(chunk_rows), k, embedder.device)
    found = index.rows_at(rows.flatten().tolist())
    matches = [
        Match(
            query,
            [Neighbour(row, *found[row], score) for row, score in zip(r.tolist(), s.tolist(), strict=True)],
        )
        for query, r, s in zip(readable, rows, scores, strict=True)
    ]
    return matches, unreadable
