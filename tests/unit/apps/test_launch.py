"""``mae demo``'s job (``mae.apps.page.launch``): what can be checked without loading the model is checked
first. The page itself, served, is tested in ``tests/unit/apps/test_page.py``."""

import socket

import pytest

from mae.apps.page.launch import DemoSettings, serve_demo
from mae.errors import ConfigError


def test_serve_demo__a_busy_port_is_refused_before_the_model_is_loaded():
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        with pytest.raises(ConfigError, match=f"port {port} on 127.0.0.1 is busy"):
            serve_demo(DemoSettings("no-such.ckpt", port=port))  # the checkpoint is never read
