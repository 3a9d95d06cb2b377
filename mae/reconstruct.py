"""``python -m mae.reconstruct --checkpoint CKPT IMAGE_OR_FOLDER...`` (see ``mae.cli.reconstruct_main``)."""

from mae.cli import reconstruct_main

if __name__ == "__main__":
    reconstruct_main()
