"""Memory a request freed given back to the system once its base is idle: glibc keeps freed heap pages in
its arenas, so a server's resident memory would stay at its largest request's peak (6.1 GiB after one 8 ×
2,000-token request on SmolLM2-135M, 0.44 GiB before it) however long it then sits idle. Once a base has had
no request running for :data:`DELAY` seconds, a worker thread calls glibc's ``malloc_trim(0)``. Not at once:
a client stepping in a loop would fault the pages back in on every request.
"""

from __future__ import annotations

import contextlib
import ctypes
import threading
import time
from collections.abc import Callable, Iterator

# Seconds a base stays idle before its freed memory is given back: longer than a client's pause between
# steps in a loop (its round trips, its rewards), well short of an idle spell.
DELAY = 2.0


def malloc_trim() -> bool:
    """glibc's free heap pages (every arena's) back to the system; False where there is no glibc."""
    try:
        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except (OSError, AttributeError):  # musl, macOS, Windows: no glibc
        return False
    return True


class Idle:
    """A base's requests in progress (:meth:`busy`); ``delay`` seconds after the last one ends, none
    begun since, ``trim`` runs once in a worker thread."""

    def __init__(self, delay: float = DELAY, trim: Callable[[], object] = malloc_trim) -> None:
        self.delay, self.trim = delay, trim
        self._changed = threading.Condition()
        self._busy = 0
        self._ended = 0.0
        self._thread: threading.Thread | None = None

    @contextlib.contextmanager
    def busy(self) -> Iterator[None]:
        with self._changed:
            self._busy += 1
        try:
            yield
        finally:
            with self._changed:
                self._busy -= 1
                self._ended = time.monotonic()
                if not self._busy and self._thread is None:
                    self._thread = threading.Thread(target=self._trim_when_idle, name="toolrl-tinker-trim",
                                                    daemon=True)
                    self._thread.start()
                self._changed.notify_all()

    def _trim_when_idle(self) -> None:
        with self._changed:
            while self._busy or (left := self._ended + self.delay - time.monotonic()) > 0:
                self._changed.wait(None if self._busy else left)
            self._thread = None
        self.trim()
