"""Memory a request freed is given back once its base is idle (:mod:`toolrl_tinker.idle`): glibc's
``malloc_trim`` runs after the base's last request ends, never while one runs, and not at once."""

from __future__ import annotations

import platform
import threading
import time
from typing import Any

import numpy as np
from conftest import BASE


def _wait(done: threading.Event, seconds: float = 10.0) -> bool:
    return done.wait(seconds)


def test_malloc_trim_runs_where_glibc_is() -> None:
    from toolrl_tinker.idle import malloc_trim

    assert malloc_trim() is (platform.system() == "Linux" and platform.libc_ver()[0] == "glibc")


def test_trims_once_the_last_request_has_been_idle_for_the_delay() -> None:
    from toolrl_tinker.idle import Idle

    calls: list[float] = []
    done = threading.Event()
    idle = Idle(delay=0.2, trim=lambda: (calls.append(time.monotonic()), done.set()))
    with idle.busy():
        with idle.busy():
            pass
        time.sleep(0.4)  # one request ended, the other runs: no trim
        assert not calls
    with idle.busy():  # a request begun within the delay puts the trim off until it ends
        time.sleep(0.1)
    ended = time.monotonic()
    assert _wait(done)
    assert len(calls) == 1 and calls[0] >= ended + 0.2
    time.sleep(0.3)
    assert len(calls) == 1  # once per idle spell
    done.clear()
    with idle.busy():
        pass
    assert _wait(done) and len(calls) == 2


def test_a_served_forward_backward_is_trimmed_after_it_ends(served: Any, client: Any, monkeypatch: Any) -> None:
    from tinker import types

    idle = served.service.bases[BASE].idle
    busy_at_trim: list[int] = []
    done = threading.Event()

    def trim() -> None:
        busy_at_trim.append(idle._busy)
        done.set()

    monkeypatch.setattr(idle, "trim", trim)
    monkeypatch.setattr(idle, "delay", 0.05)
    tc = client.create_lora_training_client(base_model=BASE, rank=4)
    deadline = time.time() + 10
    while idle._thread is not None and time.time() < deadline:  # an earlier request's trim done with
        time.sleep(0.05)
    done.clear()
    busy_at_trim.clear()
    tokens = list(range(11, 51))
    datum = types.Datum(model_input=types.ModelInput.from_ints(tokens[:-1]),
                        loss_fn_inputs={"target_tokens": np.array(tokens[1:], np.int64),
                                        "weights": np.ones(len(tokens) - 1, np.float32)})
    tc.forward_backward([datum], "cross_entropy").result()
    assert _wait(done), "no trim after the request ended"
    assert busy_at_trim == [0]
