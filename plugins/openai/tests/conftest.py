"""Session fixtures: the tiny random Qwen3 (built once, cached on disk) and its tokenizer."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from support import (
    ANSWER,
    CALL,
    SCRIPTED_ENGINE,
    TINY_YAML,
    ServeProcess,
    env_with,
    make_plugin_dist,
    write_config,
)


@pytest.fixture(scope="session")
def tiny_path() -> str:
    from toolrl import model_sources

    return model_sources.tiny_qwen3()


@pytest.fixture(scope="session")
def tokenizer(tiny_path: str) -> Any:
    from toolrl import model_sources

    return model_sources.load_tokenizer(tiny_path)


@pytest.fixture(scope="session")
def servers(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, ServeProcess]]:
    """Two ``toolrl serve`` processes, started together: ``scripted`` (the scripted chat engine: a
    tool call, then an answer) and ``tiny`` (examples/tiny.yaml: the tiny random Qwen3 on the
    transformers engine). Both record conversations 3 s after their last request."""
    tmp = tmp_path_factory.mktemp("serve")
    plugin = make_plugin_dist(tmp / "plugin", "toolrl-test-chat-script", "chat_script", SCRIPTED_ENGINE)
    config = write_config(tmp / "scripted.yaml", {"engine": {"name": "chat_script",
                                                             "options": {"script": [CALL, ANSWER]}}})
    started = {
        "scripted": ServeProcess(config, "--record", str(tmp / "scripted"), "--idle-timeout", "3",
                                 log=tmp / "scripted.log", env=env_with(plugin)),
        "tiny": ServeProcess(TINY_YAML, "--record", str(tmp / "tiny"), "--idle-timeout", "3", log=tmp / "tiny.log"),
    }
    try:
        yield {name: server.wait() for name, server in started.items()}
    finally:
        for server in started.values():
            server.interrupt()  # both shut down at once
        for server in started.values():
            server.stop()


@pytest.fixture(scope="session")
def scripted_server(servers: dict[str, ServeProcess]) -> ServeProcess:
    return servers["scripted"]


@pytest.fixture(scope="session")
def tiny_server(servers: dict[str, ServeProcess]) -> ServeProcess:
    return servers["tiny"]
