"""Which of the two reading paths a file takes, decided once from its header for every consumer
(folder data, shards, statistics, reconstructions): what its pixels are (``PixelFormat``), and the one
rule that sends data down the 8-bit RGB path or the array path (``reads_as_rgb``)."""

from dataclasses import dataclass

from mae.data.decoding.headers import ImageHeader

RGB_DTYPE = "uint8"  # the only pixel type the RGB path reads without losing values


@dataclass(frozen=True)
class PixelFormat:
    """What a file's pixels are, from its header: the channels and stored dtype the array path
    returns, and whether the file is one only the array path reads."""

    channels: int
    dtype: str
    array_file: bool = False

    @classmethod
    def of(cls, header: ImageHeader, array_file: bool) -> "PixelFormat":
        return cls(header.channels, header.dtype.name, array_file)

    @property
    def kind(self) -> tuple[int, str]:
        """(channels, dtype name): what every file of array-path data must share (recorded in shards)."""
        return self.channels, self.dtype

    @property
    def rgb_readable(self) -> bool:
        """8-bit pixels in a file PIL reads: the RGB path converts them without loss."""
        return self.dtype == RGB_DTYPE and not self.array_file


def reads_as_rgb(in_chans: int, rgb_readable: bool) -> bool:
    """The one rule for how data is read: 8-bit files PIL reads (RGB, grayscale, palette, RGBA,
    CMYK: converted to RGB) take the 8-bit RGB path for a 3-channel model; any other channel count,
    16-bit, float, TIFF and ``.npy`` data the array path, which keeps bit depth and bands.

    ``rgb_readable``: whether every file of the data is ``PixelFormat.rgb_readable``."""
    return in_chans == 3 and rgb_readable
