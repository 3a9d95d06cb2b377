"""Progress of long evaluation work (feature extraction, the probe's heads) on stderr, so minutes of work
never pass with nothing on screen: tqdm's bar on a terminal; elsewhere (a log file, a scheduler's output,
a pipe) one line every ``LINE_INTERVAL_S`` seconds and one at the end, which a log keeps readable."""

import sys
import time
from typing import TextIO

from tqdm import tqdm

LINE_INTERVAL_S = 30.0
LINE_FORMAT = "{desc}: {n_fmt}/{total_fmt} {unit} ({percentage:.0f}%) in {elapsed}"


class Progress:
    """Progress of ``total`` units of work described by ``desc`` ("kNN: training images") on ``stream``
    (default stderr): a tqdm bar (cleared when done) when ``stream`` is a terminal, else a line
    every ``interval`` seconds and a last one on ``close``; nothing at all when not ``enabled``.
    Use it in a ``with`` block and ``update(n)`` after each batch of ``n`` units."""

    def __init__(
        self,
        total: int,
        desc: str,
        unit: str = "images",
        enabled: bool = True,
        stream: TextIO | None = None,
        interval: float = LINE_INTERVAL_S,
    ) -> None:
        self.stream = sys.stderr if stream is None else stream
        self.total, self.desc, self.unit, self.interval = total, desc, unit, interval
        self.done, self.shown = 0, -1  # units done, and when the last line was written
        self.start = self.last_line = time.monotonic()
        terminal = enabled and self.stream.isatty()
        self.bar = None
        if terminal:
            self.bar = tqdm(total=total, desc=desc, unit=unit, file=self.stream, leave=False)
        self.lines = enabled and not terminal

    def update(self, n: int) -> None:
        """``n`` more units done."""
        self.done += n
        if self.bar is not None:
            self.bar.update(n)
        elif self.lines and time.monotonic() - self.last_line >= self.interval:
            self._line()

    def close(self) -> None:
        """Clear the bar, or write the last line (the units done and the time it took)."""
        if self.bar is not None:
            self.bar.close()
        elif self.lines and self.shown != self.done:
            self._line()
        self.bar, self.lines = None, False

    def _line(self) -> None:
        self.last_line, self.shown = time.monotonic(), self.done
        text = tqdm.format_meter(
            self.done,
            self.total,
            self.last_line - self.start,
            prefix=self.desc,
            unit=self.unit,
            bar_format=LINE_FORMAT,
        )
        print(text, file=self.stream, flush=True)

    def __enter__(self) -> "Progress":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
