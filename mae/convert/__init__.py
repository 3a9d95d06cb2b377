"""Weight conversion between our MAE layout and other codebases' layouts."""
