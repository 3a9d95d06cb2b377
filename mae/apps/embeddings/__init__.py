"""Image embeddings and similar-image search: the encoder that embeds one image (``embedder``), the
resumable run over folders (``embed_run``), the index file (``embedding_index``), exact cosine top-k
(``similarity``), searching an index with the encoder that made it (``image_search``), the figure of
the neighbours found (``neighbours_figure``) and the t-SNE map of an index (``embedding_map``)."""
