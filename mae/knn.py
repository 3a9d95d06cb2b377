"""``python -m mae.knn --checkpoint CKPT --data.class_path ...`` (see ``mae.cli.knn_main``)."""

from mae.cli import knn_main

if __name__ == "__main__":
    knn_main()
