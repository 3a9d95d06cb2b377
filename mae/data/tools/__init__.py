"""Commands that prepare data: the shard converter and the per-channel statistics."""
