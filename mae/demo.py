"""``python -m mae.demo --checkpoint CKPT``: the local reconstruction page (see ``mae.cli.demo_main``)."""

from mae.cli import demo_main

if __name__ == "__main__":
    demo_main()
