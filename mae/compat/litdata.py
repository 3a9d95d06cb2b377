"""Private names of litdata (tested with litdata 0.2.76).

- ``StreamingDataset._on_demand_bytes`` and ``cache._reader.on_demand_bytes``: whether a sample read
  by index is fetched by byte range. The public ``on_demand_bytes`` setter needs a cache, which
  litdata builds on first use from the private attribute, and litdata itself turns it back on after
  every epoch.
- ``litdata.streaming.downloader._OBSTORE_CLIENT_OPTIONS``: the client options of litdata's obstore
  downloads, which leave out ``allow_http``; no setting of litdata passes one.
"""

from typing import Any


def read_whole_chunks(dataset: Any) -> None:
    """Make a litdata ``StreamingDataset`` read every sample from its whole chunk (downloaded to the
    cache), never by byte range: now when its cache exists, and in the cache it builds later."""
    dataset._on_demand_bytes = False
    if dataset.cache is not None:
        dataset.cache._reader.on_demand_bytes = False


def allow_http_downloads() -> None:
    """Let litdata's obstore downloads reach ``http://`` endpoints (https ones are unchanged)."""
    from litdata.streaming import downloader

    downloader._OBSTORE_CLIENT_OPTIONS["allow_http"] = "true"
