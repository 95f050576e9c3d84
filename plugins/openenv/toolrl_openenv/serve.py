"""``python -m toolrl_openenv.serve APP PORT``: an OpenEnv server under uvicorn on 127.0.0.1:PORT that
exits when its stdin closes, so it never outlives the run that started it (whatever ends that run:
a normal exit, Ctrl-C, a crash or SIGKILL all close the pipe). Once the app is imported, the
collector policy of a process holding many sessions (``toolrl.gc_policy``): the server holds
one environment per open episode."""

from __future__ import annotations

import os
import sys
import threading


def _exit_when_parent_goes() -> None:
    sys.stdin.buffer.read()  # returns at EOF: the parent closed the pipe or died
    os._exit(0)


def main() -> None:
    import uvicorn
    from toolrl.plugin_support import after_startup
    from uvicorn.importer import import_from_string

    threading.Thread(target=_exit_when_parent_goes, daemon=True).start()
    app, port = import_from_string(sys.argv[1]), int(sys.argv[2])
    after_startup()
    uvicorn.run(app, host="127.0.0.1", port=port, log_level="warning", ws_max_size=100 * 2**20)


if __name__ == "__main__":
    main()
