"""Files and object storage, below every other layer: atomic writes (no half-written file, a clear
error on a full disk) and the local-or-S3 file operations the shard tool and the streaming data read."""
