"""``python finetune.py ...`` is ``mae finetune ...`` (``mae finetune --help``): the
fine-tuning entry point of a clone, for scripts that call it."""

import sys

from mae.cli.main import main

if __name__ == "__main__":
    main(["finetune", *sys.argv[1:]])
