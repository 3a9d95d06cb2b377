"""``python train.py ...`` is ``mae pretrain ...`` (``mae pretrain --help``): the
pretraining entry point of a clone, for scripts that call it."""

import sys

from mae.cli.main import main

if __name__ == "__main__":
    main(["pretrain", *sys.argv[1:]])
