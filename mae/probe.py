"""``python -m mae.probe --checkpoint CKPT --data.class_path ...`` (see ``mae.cli.probe_main``)."""

from mae.cli import probe_main

if __name__ == "__main__":
    probe_main()
