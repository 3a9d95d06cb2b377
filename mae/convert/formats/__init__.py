"""Checkpoint formats, one module each: ``detect`` (is this path one?), ``read`` (it, as an
``MAECheckpoint``) and, where the format is written, ``write``. Each module's ``FORMAT`` (the Hugging Face
module: ``FOLDER_FORMAT`` and ``FILE_FORMAT``) is one row of ``mae.convert.sources.CHECKPOINT_FORMATS``,
the ordered table ``read_checkpoint`` walks; ``base`` holds the row's type."""
