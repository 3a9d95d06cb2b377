"""How fast ``mae embed`` embeds images, and how long exact search takes over a large index.

1. Embedding: the built-in digits (32x32 PNG files in an ImageFolder, as ``mae demo``
   writes them) through ``embed_images`` with the given checkpoint: images/s of the whole run (reading,
   encoding, the parts, the assembled Parquet), the model's loading excluded.
2. Search: a Parquet index of ``--rows`` random ``--dim``-long vectors, written in chunks, then
   ``--queries`` queries against it in chunks of ``--chunk-rows``
   (``mae.apps.embeddings.similarity.cosine_top_k``, as ``mae search`` runs it): seconds, and the
   process's peak memory.

    python benchmarks/embed_search.py --checkpoint runs/pretrain_default/version_0/checkpoints/last.ckpt
    python benchmarks/embed_search.py --checkpoint CKPT --rows 1000000 --dim 768 --device cuda
"""

import argparse
import resource
import tempfile
import time
from pathlib import Path

import numpy as np
import torch
from PIL import Image

from mae.apps.embeddings.embed_run import embed_images, listed_images
from mae.apps.embeddings.embedder import load_embedder
from mae.apps.embeddings.embedding_index import EmbeddingIndex, IndexMeta, Rows, write_index
from mae.apps.embeddings.similarity import cosine_top_k


def write_digits(root: Path, count: int) -> Path:
    """The first ``count`` built-in digits as root/<digit>/<i>.png, 32x32."""
    from sklearn.datasets import load_digits

    digits = load_digits()
    for i in range(min(count, len(digits.images))):
        folder = root / str(digits.target[i])
        folder.mkdir(parents=True, exist_ok=True)
        pixels = np.round(digits.images[i] * 255 / 16).astype(np.uint8)
        Image.fromarray(pixels).resize((32, 32)).save(folder / f"{i:04d}.png")
    return root


def embedding_rate(checkpoint: str, count: int, workers: int, batch_size: int, device: str) -> dict:
    with tempfile.TemporaryDirectory() as tmp:
        items = listed_images([write_digits(Path(tmp) / "digits", count)])
        embedder = load_embedder(checkpoint, device=device)
        start = time.perf_counter()
        meta = embed_images(
            embedder, items, Path(tmp) / "digits.parquet", batch_size, workers, progress=False
        )
        seconds = time.perf_counter() - start
    return {"images": meta.count, "seconds": seconds, "img_s": meta.count / seconds, "dim": meta.dim}


def random_rows(rows: int, dim: int, chunk: int):
    """``Rows`` of random vectors, ``chunk`` at a time (the same on every pass)."""

    class Chunks:
        def __iter__(self):
            generator = np.random.default_rng(0)
            for start in range(0, rows, chunk):
                n = min(chunk, rows - start)
                vectors = generator.standard_normal((n, dim), dtype=np.float32)
                yield Rows([f"/data/{i:08d}.jpg" for i in range(start, start + n)], [None] * n, vectors)

    return Chunks()


def search_time(rows: int, dim: int, queries: int, k: int, chunk_rows: int, device: str) -> dict:
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "index.parquet"
        meta = IndexMeta("random", "0" * 64, "cls", dim, [32, 32], 3, [0.5] * 3, [0.5] * 3, count=rows)
        write_index(path, meta, random_rows(rows, dim, 65536))
        index = EmbeddingIndex(path)
        query = torch.from_numpy(np.random.default_rng(1).standard_normal((queries, dim), dtype=np.float32))
        before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        start = time.perf_counter()
        scores, found = cosine_top_k(query, index.vector_chunks(chunk_rows), k, device)
        index.rows_at(found.flatten().tolist())
        seconds = time.perf_counter() - start
        peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss  # KiB on Linux
        size = path.stat().st_size
    return {
        "rows": rows,
        "dim": dim,
        "seconds": seconds,
        "file_mb": size / 2**20,
        "peak_rss_mb": peak / 1024,
        "peak_rss_growth_mb": (peak - before) / 1024,
    }


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--checkpoint", required=True)
    parser.add_argument("--images", type=int, default=1797, help="digits to embed (at most 1,797)")
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--batch-size", type=int, default=256)
    parser.add_argument("--rows", type=int, default=1_000_000)
    parser.add_argument("--dim", type=int, default=128, help="128: the default digits model's cls vector")
    parser.add_argument("--queries", type=int, default=8)
    parser.add_argument("-k", type=int, default=8)
    parser.add_argument("--chunk-rows", type=int, default=65536)
    parser.add_argument("--device", default="cpu")
    args = parser.parse_args(argv)
    print(f"torch threads: {torch.get_num_threads()}")
    embed = embedding_rate(args.checkpoint, args.images, args.workers, args.batch_size, args.device)
    print(
        f"embed: {embed['images']} digits, {embed['seconds']:.1f} s, {embed['img_s']:.0f} images/s "
        f"({args.workers} workers, batch {args.batch_size}, {args.device})"
    )
    search = search_time(args.rows, args.dim, args.queries, args.k, args.chunk_rows, args.device)
    print(
        f"search: {args.queries} queries, k={args.k}, over {search['rows']:,} x {search['dim']} "
        f"({search['file_mb']:.0f} MiB Parquet) in chunks of {args.chunk_rows:,}: {search['seconds']:.2f} s; "
        f"peak memory {search['peak_rss_mb']:.0f} MiB (+{search['peak_rss_growth_mb']:.0f} MiB while "
        "searching)"
    )
    return {"embed": embed, "search": search}


if __name__ == "__main__":
    main()
