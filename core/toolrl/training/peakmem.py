"""Peak memory of a block of work (the ``trainer_peak_mb`` metric).

- CUDA: ``torch.cuda.max_memory_allocated`` after resetting the peak at the start (tensor memory
  only; the caching allocator's reserve and the CUDA context are not counted).
- CPU: the process's resident set size (``/proc/self/statm``), sampled by a thread every 2 ms and at
  both ends, maximum taken. It is the whole process (rollout engines or other threads sharing it
  count too), and a spike shorter than the sampling interval can be missed. The kernel's own
  high-water marks were not used: ``ru_maxrss`` covers the process's lifetime, and resetting
  ``VmHWM`` (``/proc/self/clear_refs``) would falsify it for anyone else reading it.
- Elsewhere (no ``/proc``): not measured (``None``).
"""

from __future__ import annotations

import os
import threading
from typing import Any

_PAGE = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096


def rss_bytes() -> int | None:
    try:
        with open("/proc/self/statm", "rb") as f:
            return int(f.read().split()[1]) * _PAGE
    except (OSError, ValueError, IndexError):
        return None


class PeakMemory:
    """``with PeakMemory(device) as peak: ...`` then ``peak.mb`` (None where it cannot be measured)."""

    def __init__(self, device: Any, interval_s: float = 0.002) -> None:
        self.cuda = str(device).startswith("cuda")
        self.device = device
        self.interval_s = interval_s
        self.peak: int | None = None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def _sample(self) -> None:
        rss = rss_bytes()
        if rss is not None:
            self.peak = rss if self.peak is None else max(self.peak, rss)

    def _run(self) -> None:
        while not self._stop.wait(self.interval_s):
            self._sample()

    def __enter__(self) -> PeakMemory:
        if self.cuda:
            import torch

            torch.cuda.reset_peak_memory_stats(self.device)
        else:
            self._sample()
            if self.peak is not None:
                self._thread = threading.Thread(target=self._run, name="toolrl-peak-rss", daemon=True)
                self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        if self.cuda:
            import torch

            self.peak = torch.cuda.max_memory_allocated(self.device)
        elif self._thread is not None:
            self._stop.set()
            self._thread.join()
            self._sample()

    @property
    def mb(self) -> float | None:
        return None if self.peak is None else self.peak / 2**20
