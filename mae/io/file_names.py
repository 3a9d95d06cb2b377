"""File names as text: the one rule for storing a path in a UTF-8 file (a CSV, Parquet, litdata)."""

import os


def storable_name(name: str) -> str:
    """``name`` as valid UTF-8 text: a file name that is not UTF-8 (on Linux, any bytes; Python holds them
    as surrogate escapes) keeps its other characters and shows the invalid bytes as ``\\xNN``."""
    return os.fsencode(name).decode("utf-8", "backslashreplace")
