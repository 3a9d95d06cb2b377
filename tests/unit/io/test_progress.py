"""The evaluations' progress display (``mae.io.progress.Progress``): a bar on a terminal, lines elsewhere,
nothing when turned off."""

import io

from mae.io.progress import Progress


class Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_progress__off_a_terminal_writes_a_line_per_interval_and_one_at_the_end():
    stream = io.StringIO()
    with Progress(30, "kNN: features of the training split", stream=stream, interval=0) as shown:
        shown.update(10)
        shown.update(20)
    assert stream.getvalue().splitlines() == [
        "kNN: features of the training split: 10/30 images (33%) in 00:00",
        "kNN: features of the training split: 30/30 images (100%) in 00:00",  # written once
    ]
    stream = io.StringIO()
    with Progress(30, "probe", "epochs", stream=stream) as shown:  # 30 s between lines
        shown.update(3)
    assert stream.getvalue() == "probe: 3/30 epochs (10%) in 00:00\n"  # an early stop says where


def test_progress__on_a_terminal_a_bar_cleared_at_the_end_and_nothing_when_off():
    stream = Terminal()
    with Progress(30, "kNN", stream=stream, interval=0) as shown:
        shown.update(30)
    assert stream.getvalue().startswith("\rkNN:") and "/30 [" in stream.getvalue()  # tqdm's bar
    assert "\n" not in stream.getvalue()  # one line redrawn, and cleared at the end
    for stream in (io.StringIO(), Terminal()):
        with Progress(30, "kNN", enabled=False, stream=stream, interval=0) as shown:
            shown.update(30)
        assert stream.getvalue() == ""
