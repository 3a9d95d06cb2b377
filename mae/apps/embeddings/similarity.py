"""Exact nearest neighbours by cosine similarity over vectors read in chunks: memory holds one chunk and
the best ``k`` so far, whatever the index's size."""

from collections.abc import Iterable

import torch
import torch.nn.functional as F


@torch.no_grad()
def cosine_top_k(
    queries: torch.Tensor,
    chunks: Iterable[tuple[int, torch.Tensor]],
    k: int,
    device: str | torch.device = "cpu",
) -> tuple[torch.Tensor, torch.Tensor]:
    """The ``k`` rows most similar to each query, best first.

    Args:
        queries: (Q, D) vectors.
        chunks: (first row, (n, D) vectors) in any order, e.g. ``EmbeddingIndex.vector_chunks``.
        k: neighbours per query (fewer when the rows are fewer).
        device: where the products are computed.

    Returns:
        (scores (Q, k) float32 cosine similarities in [-1, 1], rows (Q, k) int64 row numbers). A zero
        vector scores 0 against everything.
    """
    queries = F.normalize(queries.float().to(device), dim=1)
    best_scores = torch.empty(len(queries), 0, device=device)
    best_rows = torch.empty(len(queries), 0, dtype=torch.long, device=device)
    for start, vectors in chunks:
        scores = queries @ F.normalize(vectors.float().to(device), dim=1).T  # (Q, n)
        rows = torch.arange(start, start + len(vectors), device=device).expand(len(queries), -1)
        scores, rows = torch.cat([best_scores, scores], dim=1), torch.cat([best_rows, rows], dim=1)
        best_scores, order = scores.topk(min(k, scores.shape[1]), dim=1)
        best_rows = rows.gather(1, order)
    return best_scores.cpu(), best_rows.cpu()
