"""``python -m toolrl_openenv.serve APP PORT``: an OpenEnv server under uvicorn on 127.0.0.1:PORT that
exits when its stdin closes, so it never outlives the run that started it (whatever ends that run:
a normal exit, Ctrl-C, a crash or SIGKILL all close the pipe)."""

from __future__ import annotations

import os
import sys
import threading


def _exit_when_parent_goes() -> None:
    sys.stdin.buffer.read()  # returns at EOF: the parent closed the pipe or died
    os._exit(0)


def main() -> None:
    import uvicorn

    app, port = sys.argv[1], int(sys.argv[2])
    threading.Thread(target=_exit_when_parent_goes, daemon=True).start()
    uvicorn.run(app, host="127.0.0.1", port=port, log_level="warning", ws_max_size=100 * 2**20)


if __name__ == "__main__":
    main()
