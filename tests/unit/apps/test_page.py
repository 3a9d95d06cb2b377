"""The reconstruction page: its pieces alone, ``mae demo`` as a process, and the page in a
real browser: headless Chromium (Debian's ``chromium`` and ``chromium-driver``) driven through
Selenium, against the page served on localhost."""

import importlib
import io
import os
import shutil
import signal
import socket
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

from mae.apps.page import demo as demo_page
from mae.apps.page.demo import (
    MAX_SEED,
    PageSettings,
    ReconstructionSession,
    build_page,
    choose_port,
    flat_guess_loss,
    input_note,
    next_seed,
    readable_error,
    serve,
)
from tests.helpers import REPO, TINY, run_mae, start_mae, tiny_pretraining_checkpoint


def _skip_unless_ci(reason: str) -> None:
    """Skip, with ``reason``; under CI (``CI=true``), where everything is installed, fail instead."""
    if os.environ.get("CI", "").lower() in ("1", "true"):
        pytest.fail(f"CI must run the page tests: {reason}")
    pytest.skip(reason)


def _import_or_skip(module: str, reason: str):
    try:
        return importlib.import_module(module)
    except ImportError:
        _skip_unless_ci(reason)


GRADIO_MISSING = "the demo extra is not installed: pip install -e '.[demo]'"
PAGE_MAX_PIXELS = 100_000  # the served page's --max-image-pixels
PAGE_MAX_UPLOAD_MB = 1  # and its --max-upload-mb


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory) -> Path:
    """A tiny norm_pix_loss pretraining checkpoint (16x16 inputs, 4x4 patches)."""
    return tiny_pretraining_checkpoint(tmp_path_factory.mktemp("demo"))


# ---------------------------------------------------------------------------------------------------
# The page's pieces, without a browser


def test_page_settings__missing_or_out_of_range_controls_are_named():
    assert PageSettings.from_controls(0.75, "block", 3, "none") == PageSettings(0.75, "block", 3, "none")
    with pytest.raises(ValueError, match=r"mask seed must be a whole number from 0 to \d+, not empty"):
        PageSettings.from_controls(0.75, "random", None, "patch")
    with pytest.raises(ValueError, match="mask seed .* not 18446744073709551616"):
        PageSettings.from_controls(0.75, "random", 2**64, "patch")
    with pytest.raises(ValueError, match="mask seed .* not 1.5"):
        PageSettings.from_controls(0.75, "random", 1.5, "patch")
    with pytest.raises(
        ValueError, match=r"mask ratio must be a number from 0.05 to 0.95, not empty.*masking must"
    ):
        PageSettings.from_controls(None, "diagonal", 0, "patch")
    with pytest.raises(ValueError, match="norm_pix choice must be patch or none"):
        PageSettings.from_controls(0.5, "random", 0, None)
    torch.Generator().manual_seed(MAX_SEED)  # the largest seed the page takes is one torch takes


def test_next_seed__counts_up_wraps_and_leaves_an_invalid_seed_for_the_message():
    assert next_seed(4) == 5 and next_seed(MAX_SEED) == 0
    assert next_seed(None) is None and next_seed(2**64) == 2**64


def test_flat_guess_loss__is_the_masked_values_variance_for_pixels_and_about_1_for_norm_pix():
    from mae.models.mae import MaskedAutoencoderViT

    torch.manual_seed(0)
    imgs = torch.randn(2, 3, 32, 32)
    noise = torch.rand(2, 64)
    for norm_pix_loss in (False, True):
        model = MaskedAutoencoderViT(**TINY, norm_pix_loss=norm_pix_loss).eval()
        flat = flat_guess_loss(model, imgs, 0.75, noise)
        _, _, mask = model(imgs, 0.75, noise)
        patches = model.patchify(imgs).numpy().astype(np.float64)  # (2, 64, 48)
        if norm_pix_loss:
            std = (patches.var(-1, ddof=1, keepdims=True) + 1e-6) ** 0.5  # unbiased, as normalize_patches
            patches = (patches - patches.mean(-1, keepdims=True)) / std
        for i in range(2):
            masked = patches[i][mask[i].numpy() == 1]  # (48 patches, 48 values)
            assert flat[i].item() == pytest.approx(masked.var(), rel=1e-4)
        if norm_pix_loss:
            assert flat.tolist() == pytest.approx([47 / 48] * 2, rel=1e-4)  # (n - 1) / n for n = 48 values


def test_input_note__says_whether_the_image_was_resized_and_cropped():
    assert "resized to 20x16 and centre-cropped to the model's 16x16" in input_note((20, 16), (16, 16))
    assert "resized to 16x21 and centre-cropped" in input_note((30, 40), (16, 16))
    assert "resized to the model's 16x16 input, nothing cropped" in input_note((64, 64), (16, 16))
    assert "saw the whole image as it is" in input_note((16, 16), (16, 16))


def test_readable_error__names_the_file_not_the_server_path(tmp_path):
    upload = tmp_path / "gradio" / "0a1b2c" / "scan.tif"
    err = OSError(f"cannot identify image file {str(upload)!r}")
    message = readable_error(err, upload, "scan.tif")
    assert "scan.tif" in message and str(tmp_path) not in message
    assert readable_error(OSError("image file is truncated"), upload, "scan.tif").startswith("scan.tif: ")
    assert "not enough memory" in readable_error(MemoryError(), upload, "scan.tif")
    assert "RuntimeError: boom" in readable_error(RuntimeError("boom"), upload, "scan.tif")
    relative = readable_error(
        ValueError("scan.tif has 2 channels. The model takes 3."), Path("scan.tif"), "scan.tif"
    )
    assert relative == "scan.tif has 2 channels. The model takes 3."  # a relative path's "." is left alone


def test_choose_port__takes_the_next_free_port_and_names_a_busy_one(monkeypatch):
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        monkeypatch.setattr(demo_page, "DEFAULT_PORT", port)
        assert choose_port("127.0.0.1", None) > port
        with pytest.raises(OSError, match=f"port {port} on 127.0.0.1 is busy.*--port N"):
            choose_port("127.0.0.1", port)


def test_extras__dev_and_demo_require_the_same_huggingface_hub_range():
    """pip does not re-check what is installed: ``.[demo]`` after ``.[dev]`` must not move the hub
    out of the range transformers accepts (then transformers, and Lightning with it, fail to import)."""
    tomllib = pytest.importorskip("tomllib", reason="Python 3.11's TOML reader")
    from packaging.requirements import Requirement

    extras = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    for python in ("3.11", "3.12", "3.13"):
        env = {"python_version": python, "extra": ""}
        hub = {}
        for extra in ("dev", "demo"):
            reqs = [Requirement(r) for r in extras[extra]]
            hub[extra] = [
                str(r.specifier)
                for r in reqs
                if r.name == "huggingface-hub" and (r.marker is None or r.marker.evaluate(env))
            ]
        assert len(hub["dev"]) == 1 and hub["dev"] == hub["demo"], (python, hub)


# ---------------------------------------------------------------------------------------------------
# mae demo as a process


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_demo__a_busy_port_is_named_with_how_to_choose_another(checkpoint):
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        process = run_mae(
            "demo", "--checkpoint", str(checkpoint), "--port", str(port), timeout=180, check=False
        )
        err = process.stderr
    assert process.returncode != 0
    assert f"port {port} on 127.0.0.1 is busy" in err and "--port N" in err, err[-2000:]
    assert "Traceback" not in err and "GRADIO_SERVER_PORT" not in err


def test_demo__help_offers_the_page_limits(capsys):
    from mae.cli.main import invoke

    with pytest.raises(SystemExit) as exit_:
        invoke("demo", ["--help"])
    assert exit_.value.code == 0
    text = capsys.readouterr().out
    assert "--max-image-pixels" in text and "--max-upload-mb" in text


@pytest.mark.slow  # serves the page from a process of its own
def test_demo__stopping_the_page_removes_its_example_folder(checkpoint, tmp_path):
    """Ctrl-C (kill -INT) ends ``mae demo`` and removes its examples' folder; a SIGTERM takes the same handler
    (``test_serve__an_interrupt_that_comes_while_launching_still_closes_the_server``)."""
    _import_or_skip("gradio", GRADIO_MISSING)
    tmpdir = tmp_path / "tmp"
    tmpdir.mkdir()
    port = _free_port()
    # started as a script's background job (`cmd &` in a script, some schedulers' wrappers): SIGINT comes
    # in ignored, and Ctrl-C / kill -INT must still stop the page
    environment = {**os.environ, "TMPDIR": str(tmpdir)}
    args = ("--checkpoint", str(checkpoint), "--port", str(port))
    with start_mae("demo", *args, env=environment, sigint_ignored=True) as process:
        deadline = time.time() + 180
        while time.time() < deadline and process.poll() is None:
            try:
                urllib.request.urlopen(f"http://127.0.0.1:{port}/", timeout=5).close()
                break
            except OSError:
                time.sleep(0.2)
        assert process.poll() is None, process.stderr()[-3000:]
        assert list(tmpdir.glob("mae-demo-*")), "the page serves built-in examples from a temporary folder"
        process.send_signal(signal.SIGINT)
        process.wait(timeout=60)
    assert not list(tmpdir.glob("mae-demo-*"))


@pytest.mark.parametrize("stop", [signal.SIGINT, signal.SIGTERM], ids=["ctrl-c", "sigterm"])
def test_serve__an_interrupt_that_comes_while_launching_still_closes_the_server(stop):
    """Gradio's own wait closes the server only on an interrupt inside it; one during launch() (the page
    already answering, launch not yet returned) would leave the server thread and the process running.
    A SIGTERM stops the page as a Ctrl-C does (the page's own process: the ``ctrl-c`` case of
    ``test_demo__stopping_the_page_removes_its_example_folder``)."""

    class Page:
        closed, options = False, None

        def launch(self, **options):
            self.options = options
            signal.getsignal(stop)(stop, None)  # what Python runs when the signal comes

        def close(self):
            self.closed = True

    page, handlers = Page(), (signal.getsignal(signal.SIGINT), signal.getsignal(signal.SIGTERM))
    try:
        serve(page, "127.0.0.1", 1234)
    except KeyboardInterrupt:
        pytest.fail("the interrupt escaped serve() without closing the server")
    assert page.closed and page.options["share"] is False and page.options["server_port"] == 1234
    assert (signal.getsignal(signal.SIGINT), signal.getsignal(signal.SIGTERM)) == handlers  # restored


# ---------------------------------------------------------------------------------------------------
# The page in headless Chromium


@pytest.fixture(scope="module")
def page(checkpoint):
    """The page of the tiny checkpoint, served on localhost with small limits, and two examples."""
    _import_or_skip("gradio", GRADIO_MISSING)
    rng = np.random.default_rng(0)
    examples = []
    for name, size in (("example.png", (40, 30)), ("other.png", (20, 24))):
        examples.append(checkpoint.parent / name)
        Image.fromarray(rng.integers(0, 256, (*size, 3), dtype=np.uint8)).save(examples[-1])
    session = ReconstructionSession(checkpoint, max_pixels=PAGE_MAX_PIXELS)
    blocks = build_page(session, examples)
    port = _free_port()
    serve(blocks, "127.0.0.1", port, PAGE_MAX_UPLOAD_MB, block=False)
    yield f"http://127.0.0.1:{port}/", session, checkpoint.parent
    blocks.close()


@pytest.fixture(scope="module")
def browser():
    webdriver = _import_or_skip("selenium.webdriver", "selenium is not installed: pip install -e '.[dev]'")
    if not (shutil.which("chromium") and shutil.which("chromedriver")):
        _skip_unless_ci(
            "Debian's chromium and chromium-driver are missing: apt-get install chromium chromium-driver"
        )
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    for arg in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage"):
        options.add_argument(arg)
    options.add_argument("--window-size=1400,1000")
    options.binary_location = shutil.which("chromium")
    driver = webdriver.Chrome(service=Service(shutil.which("chromedriver")), options=options)
    yield driver
    driver.quit()


def _by_css(selector: str):
    from selenium.webdriver.common.by import By

    return By.CSS_SELECTOR, selector


def _wait(driver, condition, timeout: float = 60):
    from selenium.webdriver.support.ui import WebDriverWait

    return WebDriverWait(driver, timeout).until(condition)


def _open(driver, url: str) -> str:
    """Load the page and wait for the first example's panels; the details' text."""
    driver.get(url)
    return _details(driver, "masked-patch loss")


def _details(driver, contains: str, previous: str | None = None) -> str:
    """The details' text once it contains ``contains`` (and differs from ``previous``)."""

    def shown(d):
        text = d.find_element(*_by_css("#details")).text
        return text if contains in text and text != previous else False

    return _wait(driver, shown)


def _panels(driver) -> dict[str, Image.Image]:
    """The pictures of the four panels, by ``PANEL_TITLES`` key."""
    pictures = {}
    for key in demo_page.PANEL_TITLES:
        src = driver.find_element(*_by_css(f"#panel-{key} img")).get_attribute("src")
        with urllib.request.urlopen(src, timeout=30) as response:
            pictures[key] = Image.open(io.BytesIO(response.read())).convert("RGB")
    return pictures


def _no_panels(driver) -> bool:
    return not driver.find_elements(*_by_css("[id^=panel-] img"))


def _upload(driver, path: Path, replace: bool = False) -> None:
    """Upload ``path``; with ``replace``, first remove the file uploaded before."""
    if replace:
        driver.find_element(*_by_css("#upload button[aria-label='Clear']")).click()
    _wait(driver, lambda d: d.find_elements(*_by_css("#upload input[type=file]")))[0].send_keys(str(path))


def _pick_example(driver, name: str) -> None:
    driver.find_element(*_by_css("#example input")).click()
    _wait(driver, lambda d: d.find_elements(*_by_css(f"#example li[aria-label='{name}']")))[0].click()


def _set_ratio(driver, value: float) -> None:
    box = driver.find_element(*_by_css("#ratio input[type=number]"))
    box.clear()
    box.send_keys(str(value))
    driver.find_element(*_by_css("#run")).click()


def _set_seed(driver, text: str) -> None:
    from selenium.webdriver.common.keys import Keys

    box = driver.find_element(*_by_css("#seed input"))
    box.send_keys(Keys.CONTROL, "a")
    box.send_keys(Keys.BACKSPACE)
    if text:
        box.send_keys(text)
    driver.find_element(*_by_css("#run")).click()


def _same(a: Image.Image, b: Image.Image) -> bool:
    return a.size == b.size and np.abs(np.asarray(a, np.int16) - np.asarray(b, np.int16)).max() <= 2


def _random_png(path: Path, height: int, width: int, seed: int = 1) -> Path:
    Image.fromarray(np.random.default_rng(seed).integers(0, 256, (height, width, 3), dtype=np.uint8)).save(
        path
    )
    return path


def test_page__upload_an_image_change_the_ratio_and_see_the_panels_change(page, browser, tmp_path):
    url, session, _ = page
    first = _open(browser, url)
    upload = _random_png(tmp_path / "mine.png", 50, 64)
    _upload(browser, upload)
    at_75 = _details(browser, "mine.png", first)
    expected = session.render(upload, PageSettings(0.75, "random", 0, "patch"))
    shown = _panels(browser)
    assert all(_same(shown[key], expected.panels[key]) for key in demo_page.PANEL_TITLES)
    _set_ratio(browser, 0.25)
    details = _details(browser, "Mask ratio 0.25", at_75)
    assert np.asarray(_panels(browser)["masked"]).tolist() != np.asarray(shown["masked"]).tolist()
    assert "masked-patch loss" in details


def test_page__the_loss_stands_beside_a_flat_guess_and_the_panels_say_what_they_show(page, browser, tmp_path):
    url, session, _ = page
    first = _open(browser, url)
    _upload(browser, _random_png(tmp_path / "wide.png", 50, 64))
    details = _details(browser, "wide.png", first)
    expected = session.render(tmp_path / "wide.png", PageSettings(0.75, "random", 0, "patch"))
    assert f"masked-patch loss {expected.loss:.4f}" in details
    assert "a flat guess" in details and f"scores {expected.flat_guess:.4f}" in details
    assert expected.flat_guess == pytest.approx(
        47 / 48, abs=1e-3
    )  # a norm_pix model: about 1 by construction
    assert ("is better than" if expected.loss < expected.flat_guess else "is no better than") in details
    assert "64x50 pixels, resized to 20x16 and centre-cropped to the model's 16x16 input" in details
    for key, title in demo_page.PANEL_TITLES.items():
        assert title in browser.find_element(*_by_css(f"#panel-{key}")).text
    assert "grey squares are the masked patches" in browser.find_element(*_by_css("#legend")).text


def test_page__the_last_of_upload_and_example_is_shown(page, browser, tmp_path):
    url, session, folder = page
    first = _open(browser, url)
    _upload(browser, _random_png(tmp_path / "mine.png", 30, 30))
    after_upload = _details(browser, "mine.png", first)
    _pick_example(browser, "other.png")
    _details(browser, "other.png", after_upload)
    expected = session.render(folder / "other.png", PageSettings(0.75, "random", 0, "patch"))
    assert _same(_panels(browser)["original"], expected.panels["original"])
    assert "mine.png" not in browser.find_element(*_by_css("#upload")).text  # the upload was cleared
    browser.find_element(*_by_css("#run")).click()  # and stays cleared: the example is still shown
    time.sleep(2)
    assert "other.png" in _details(browser, "masked-patch loss")


def test_page__an_empty_or_huge_seed_says_what_is_wrong_and_clears_the_stale_loss(page, browser):
    url, _, _ = page
    first = _open(browser, url)
    _set_seed(browser, "")
    message = _details(browser, "mask seed", first)
    assert "mask seed must be a whole number" in message and "not empty" in message
    assert "masked-patch loss" not in message and _no_panels(browser)
    # on the page, not in a Gradio toast (which is gone after 10 s): no toast is shown, and the message stays
    time.sleep(1)
    assert not browser.find_elements(*_by_css("[data-testid=toast-body]"))
    assert browser.find_element(*_by_css("#details")).text == message
    _set_seed(browser, str(2**64))
    assert f"from 0 to {MAX_SEED}" in _details(browser, "mask seed")
    _set_seed(browser, "3")
    assert "seed 3" in _details(browser, "masked-patch loss")


def test_page__an_unreadable_image_shows_an_error_naming_it(page, browser, tmp_path):
    url, _, _ = page
    first = _open(browser, url)
    broken = tmp_path / "broken.png"
    broken.write_bytes(b"\x89PNG\r\n\x1a\n this is not the rest of a png")
    _upload(browser, broken)
    message = _details(browser, "broken.png", first)
    assert "Could not show this image" in message and _no_panels(browser)
    assert tempfile.gettempdir() not in message and str(tmp_path) not in message  # no server path
    assert browser.find_elements(*_by_css("#run"))  # and the page still works


def test_page__a_truncated_png_is_named(page, browser, tmp_path):
    url, _, _ = page
    first = _open(browser, url)
    whole = _random_png(tmp_path / "whole.png", 40, 40).read_bytes()
    (tmp_path / "truncated.png").write_bytes(whole[: len(whole) // 2])
    _upload(browser, tmp_path / "truncated.png")
    message = _details(browser, "Could not show", first)
    assert "truncated.png" in message and tempfile.gettempdir() not in message


def test_page__an_image_over_the_pixel_limit_names_the_page_option(page, browser, tmp_path):
    url, _, _ = page
    first = _open(browser, url)
    _upload(browser, _random_png(tmp_path / "huge.png", 300, 400))
    message = _details(browser, "huge.png", first)
    assert (
        f"over this page's limit of {PAGE_MAX_PIXELS:,}" in message and "--max-image-pixels 120000" in message
    )
    assert "data.max_image_pixels" not in message


def test_page__any_exception_from_one_image_is_a_message(page, browser, tmp_path, monkeypatch):
    url, _, _ = page
    load_image = demo_page.load_image

    def failing(path, *args, **kwargs):
        if Path(path).name == "memory.png":
            raise MemoryError()
        if Path(path).name == "runtime.png":
            raise RuntimeError("[enforce fail at alloc_cpu.cpp:117] can't allocate memory")
        return load_image(path, *args, **kwargs)

    monkeypatch.setattr(demo_page, "load_image", failing)
    details = _open(browser, url)
    _upload(browser, _random_png(tmp_path / "memory.png", 20, 20))
    details = _details(browser, "memory.png", details)
    assert "not enough memory" in details and _no_panels(browser)
    _upload(browser, _random_png(tmp_path / "runtime.png", 20, 20), replace=True)
    assert "RuntimeError: [enforce fail" in _details(browser, "runtime.png", details)


def test_page__names_the_checkpoint_not_its_path_and_refuses_large_uploads(page, browser, tmp_path):
    url, _, folder = page
    first = _open(browser, url)
    assert "last.ckpt" in browser.page_source and str(folder) not in browser.page_source
    big = _random_png(tmp_path / "big.png", 800, 800)  # about 1.9 MB of noise, over the page's 1 MB
    assert big.stat().st_size > PAGE_MAX_UPLOAD_MB * 1024**2
    _upload(browser, big)
    _wait(browser, lambda d: "exceed the maximum allowed size of 1.0 Mb" in d.page_source)  # Gradio's message
    time.sleep(2)
    assert browser.find_element(*_by_css("#details")).text == first  # nothing was reconstructed


@pytest.mark.browser
def test_page_screenshot__the_page_with_its_four_panels_and_an_existing_file_refused(checkpoint, tmp_path):
    """benchmarks/page_screenshot.py, the docs' figure of the page: a picture of the page as served."""
    _import_or_skip("gradio", GRADIO_MISSING)
    _import_or_skip("selenium.webdriver", "selenium is not installed: pip install -e '.[dev]'")
    if not (shutil.which("chromium") and shutil.which("chromedriver")):
        _skip_unless_ci(
            "Debian's chromium and chromium-driver are missing: apt-get install chromium chromium-driver"
        )
    spec = importlib.util.spec_from_file_location(
        "page_screenshot", REPO / "benchmarks" / "page_screenshot.py"
    )
    script = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(script)
    out = tmp_path / "page.png"
    script.main(["--checkpoint", str(checkpoint), "--out", str(out), "--size", "1000x700"])
    picture = np.asarray(Image.open(out).convert("L"), np.float32)
    assert (
        picture.shape[1] == 1000 and picture.std() > 10
    )  # the page drawn (the viewport: the window less its bars)
    written = out.read_bytes()
    with pytest.raises(SystemExit):
        script.main(["--checkpoint", str(checkpoint), "--out", str(out)])
    assert out.read_bytes() == written  # nothing overwritten


def test_demo__without_gradio_an_error_line_naming_the_extra(checkpoint, capsys, monkeypatch):
    from functools import partial

    from mae.cli.command import USAGE_ERROR_EXIT_CODE, run_command
    from mae.cli.main import invoke

    monkeypatch.setitem(sys.modules, "gradio", None)  # as if the demo extra were not installed
    monkeypatch.delenv("MAE_DEBUG", raising=False)
    with pytest.raises(SystemExit) as stopped:
        run_command(partial(invoke, "demo", ["--checkpoint", str(checkpoint)]))
    assert stopped.value.code == USAGE_ERROR_EXIT_CODE
    last = capsys.readouterr().err.strip().splitlines()[-1]
    assert last.startswith('error: the demo page needs Gradio: pip install -e ".[demo]"')
