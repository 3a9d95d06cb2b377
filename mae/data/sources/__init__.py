"""Where images come from: the data modules on one base, the folder layout, shards, loaders."""
