"""The reconstruction page, in a real browser: headless Chromium (Debian's ``chromium`` and
``chromium-driver``) driven through Selenium, against the page served on localhost."""

import io
import shutil
import socket
import time
import urllib.request

import numpy as np
import pytest
from PIL import Image

from tests.helpers import tiny_pretraining_checkpoint

gr = pytest.importorskip("gradio", reason="the demo extra is not installed: pip install -e '.[demo]'")
webdriver = pytest.importorskip("selenium.webdriver", reason="selenium is not installed: pip install -e '.[dev]'")
if not (shutil.which("chromium") and shutil.which("chromedriver")):
    pytest.skip("Debian's chromium and chromium-driver are not installed", allow_module_level=True)

from selenium.webdriver.chrome.service import Service  # noqa: E402
from selenium.webdriver.common.by import By  # noqa: E402
from selenium.webdriver.support.ui import WebDriverWait  # noqa: E402

from mae.eval.demo_page import ReconstructionSession, build_page  # noqa: E402


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def page(tmp_path_factory):
    """The page of a tiny pretraining checkpoint, served on localhost, and an example image."""
    tmp = tmp_path_factory.mktemp("demo")
    tiny_pretraining_checkpoint(tmp)
    rng = np.random.default_rng(0)
    Image.fromarray(rng.integers(0, 256, (40, 30, 3), dtype=np.uint8)).save(tmp / "example.png")
    session = ReconstructionSession(tmp / "last.ckpt")
    blocks = build_page(session, [tmp / "example.png"])
    port = _free_port()
    blocks.launch(server_name="127.0.0.1", server_port=port, prevent_thread_lock=True, quiet=True)
    yield f"http://127.0.0.1:{port}/", session, tmp
    blocks.close()


@pytest.fixture(scope="module")
def browser():
    options = webdriver.ChromeOptions()
    for arg in (
        "--headless=new",
        "--no-sandbox",
        "--disable-gpu",
        "--disable-dev-shm-usage",
        "--window-size=1400,1000",
    ):
        options.add_argument(arg)
    options.binary_location = shutil.which("chromium")
    driver = webdriver.Chrome(service=Service(shutil.which("chromedriver")), options=options)
    yield driver
    driver.quit()


def _figure(driver, previous: str | None = None, timeout: float = 60) -> tuple[str, Image.Image]:
    """The source and pixels of the figure once it is shown (and differs from ``previous``)."""

    def shown(d):
        images = d.find_elements(By.CSS_SELECTOR, "#figure img")
        src = images[0].get_attribute("src") if images else None
        return src if src and src != previous else False

    src = WebDriverWait(driver, timeout).until(shown)
    with urllib.request.urlopen(src, timeout=30) as response:
        return src, Image.open(io.BytesIO(response.read())).convert("RGB")


def _set_ratio(driver, value: float) -> None:
    box = driver.find_element(By.CSS_SELECTOR, "#ratio input[type=number]")
    box.clear()
    box.send_keys(str(value))
    driver.find_element(By.CSS_SELECTOR, "#run").click()


def test_page__upload_an_image_change_the_ratio_and_see_the_figure_change(page, browser, tmp_path):
    url, session, _ = page
    browser.get(url)
    first_src, _ = _figure(browser)  # the example, rendered as the page opens
    rng = np.random.default_rng(1)
    upload = tmp_path / "mine.png"
    Image.fromarray(rng.integers(0, 256, (50, 64, 3), dtype=np.uint8)).save(upload)
    browser.find_element(By.CSS_SELECTOR, "#upload input[type=file]").send_keys(str(upload))
    src_75, at_75 = _figure(browser, first_src)
    expected, _ = session.render(upload, 0.75, "random", 0)
    assert at_75.size == expected.size
    assert np.abs(np.asarray(at_75, np.int16) - np.asarray(expected, np.int16)).max() <= 2  # the same figure
    _set_ratio(browser, 0.25)
    _, at_25 = _figure(browser, src_75)
    assert at_25.size == at_75.size and np.asarray(at_25).tolist() != np.asarray(at_75).tolist()
    details = browser.find_element(By.CSS_SELECTOR, "#details").text
    assert "masked-patch loss" in details and "mask ratio 0.25" in details


def test_page__an_unreadable_image_shows_an_error_naming_it(page, browser, tmp_path):
    url, _, _ = page
    browser.get(url)
    _figure(browser)
    broken = tmp_path / "broken.png"
    broken.write_bytes(b"\x89PNG\r\n\x1a\n this is not the rest of a png")
    browser.find_element(By.CSS_SELECTOR, "#upload input[type=file]").send_keys(str(broken))
    deadline = time.time() + 60
    while "broken.png" not in browser.page_source and time.time() < deadline:
        time.sleep(0.5)
    assert "broken.png" in browser.page_source  # the error, shown on the page
    assert browser.find_elements(By.CSS_SELECTOR, "#run")  # and the page still works
