# The driver of a /run_jupyter request, run as the python program of a sandbox (never imported by the
# server): it starts a Jupyter kernel (jupyter_client, ipykernel) inside the sandbox, runs the cells in
# order in it (they share its state), and writes each cell's stdout, stderr, displays and errors as
# JSON to the file the launcher fetches. The launcher appends the call: _main(CONFIG_JSON).
import json
import os
import sys
import time


def _main(config_json):
    config = json.loads(config_json)
    started = time.monotonic()
    if config["packages"]:  # jupyter_client and ipykernel mounted from the server's environment
        sys.path.insert(0, config["packages"])
        os.environ["PYTHONPATH"] = config["packages"]  # the kernel's too
    # Jupyter's and IPython's files go to /tmp, not the working folder the request's files are in.
    os.environ.update({"JUPYTER_RUNTIME_DIR": "/tmp/jupyter/runtime", "JUPYTER_DATA_DIR": "/tmp/jupyter/data",
                       "JUPYTER_CONFIG_DIR": "/tmp/jupyter/config", "IPYTHONDIR": "/tmp/ipython",
                       "JUPYTER_PLATFORM_DIRS": "1"})
    os.makedirs("/tmp/jupyter", exist_ok=True)
    from jupyter_client import KernelManager

    # IPC sockets in /tmp: no ports, and the kernel does not warn about unencrypted TCP.
    manager = KernelManager(kernel_name=config["kernel"], transport="ipc", ip="/tmp/jupyter/kernel")
    manager.start_kernel()
    client = manager.blocking_client()
    client.start_channels()
    deadline = started + config["total_timeout"]
    status, cells = "Error", []  # until every cell ran, or one ran out of time
    try:
        client.wait_for_ready(timeout=max(1.0, deadline - time.monotonic()))
        for cell in config["cells"]:
            result = {"stdout": "", "stderr": "", "display": [], "error": []}

            def hook(message, result=result):
                kind, content = message["header"]["msg_type"], message["content"]
                if kind == "stream":
                    result[content["name"]] += content["text"]
                elif kind in ("display_data", "execute_result"):
                    result["display"].append(content["data"])
                elif kind == "error":
                    result["error"].append(content)

            limit = deadline - time.monotonic()
            if config["cell_timeout"] > 0:
                limit = min(limit, config["cell_timeout"])
            cells.append(result)
            try:
                if limit <= 0:
                    raise TimeoutError
                client.execute_interactive(cell, output_hook=hook, timeout=limit, allow_stdin=False)
            except TimeoutError:
                status = "TimeLimitExceeded"
                break
        else:
            status = "Finished"
    finally:
        with open(config["output"], "w") as f:
            json.dump({"status": status, "cells": cells}, f)
        client.stop_channels()
        manager.shutdown_kernel(now=True)
