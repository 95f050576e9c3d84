"""Go's build cache, one per sandbox object (one per ``toolrl sandbox serve``), shared by its runs.

Go 1.20+ ships no compiled standard library: with an empty cache, every run compiles the packages a
hello world imports (about 35 s on two cores, past SandboxFusion's 10 s compile limit). The cache is
a host folder, warmed once by building a hello world and a trivial test on the host with the
sandbox's own environment (so the cache keys match a run's), then mounted read-only at ``GO_CACHE``
in every sandbox: runs read the compiled packages and cannot add to or change what other runs read
(Go carries on when its cache cannot be written). Removed when the sandbox object closes.
"""

from __future__ import annotations

import logging
import os
import shutil
import subprocess
import tempfile
import threading

logger = logging.getLogger(__name__)

_WARM_FILES = {
    "main.go": 'package main\n\nimport "fmt"\n\nfunc main() { fmt.Println("warm") }\n',
    "main_test.go": 'package main\n\nimport "testing"\n\nfunc TestWarm(t *testing.T) {}\n',
}


class GoBuildCache:
    """The host folder (created now, empty) and its one-time warm-up (:meth:`warm`, thread-safe)."""

    def __init__(self) -> None:
        self.path = tempfile.mkdtemp(prefix="toolrl-go-build-")
        os.chmod(self.path, 0o755)  # the sandbox's uid reads it
        self._lock = threading.Lock()
        self._warmed = False

    def warm(self, go: str, env: dict[str, str], timeout: float = 600.0) -> None:
        """Compile what a hello world and a test import, once; later calls return at once. A failed
        warm-up is logged: runs then compile for themselves, as without the cache."""
        with self._lock:
            if self._warmed:
                return
            self._warmed = True
            with tempfile.TemporaryDirectory(prefix="toolrl-go-warm-") as work:
                for name, text in _WARM_FILES.items():
                    with open(os.path.join(work, name), "w") as f:
                        f.write(text)
                run_env = {**env, "GOCACHE": self.path, "GOPATH": os.path.join(work, "gopath"), "HOME": work,
                           "PWD": work, "TMPDIR": work}
                # -count=1: the warm-up's test result is not cached (a run's identical test would read "(cached)").
                for argv in ([go, "build", "-o", "out", "main.go"], [go, "test", "-count=1", "main_test.go"]):
                    try:
                        proc = subprocess.run(argv, cwd=work, env=run_env, capture_output=True, text=True,
                                              timeout=timeout)
                    except (OSError, subprocess.TimeoutExpired) as exc:
                        logger.warning("warming Go's build cache failed (%s): %s", " ".join(argv[1:]), exc)
                        break
                    if proc.returncode != 0:
                        logger.warning("warming Go's build cache failed (%s): %s", " ".join(argv[1:]),
                                       proc.stderr.strip()[-500:])
                        break
            for folder, dirs, files in os.walk(self.path):  # readable by the sandbox's uid whatever the umask
                for name in dirs:
                    os.chmod(os.path.join(folder, name), 0o755)
                for name in files:
                    os.chmod(os.path.join(folder, name), 0o644)

    def close(self) -> None:
        shutil.rmtree(self.path, ignore_errors=True)
