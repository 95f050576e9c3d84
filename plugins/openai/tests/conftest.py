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
    from toolrl import models

    return models.tiny_qwen3()


@pytest.fixture(scope="session")
def tokenizer(tiny_path: str) -> Any:
    from toolrl import models

    return models.load_tokenizer(tiny_path)


@pytest.fixture(scope="session")
def scripted_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServeProcess]:
    """``toolrl serve`` with the scripted chat engine (a tool call, then an answer); conversations
    are recorded 3 s after their last request."""
    tmp = tmp_path_factory.mktemp("scripted")
    plugin = make_plugin_dist(tmp / "plugin", "toolrl-test-chat-script", "chat_script", SCRIPTED_ENGINE)
    config = write_config(tmp / "scripted.yaml", {"engine": {"name": "chat_script",
                                                             "options": {"script": [CALL, ANSWER]}}})
    server = ServeProcess(config, "--record", str(tmp / "record"), "--idle-timeout", "3", log=tmp / "serve.log",
                          env=env_with(plugin))
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture(scope="session")
def tiny_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServeProcess]:
    """``toolrl serve examples/tiny.yaml``: the tiny random Qwen3 on the transformers engine."""
    tmp = tmp_path_factory.mktemp("tiny")
    server = ServeProcess(TINY_YAML, "--record", str(tmp / "record"), "--idle-timeout", "3", log=tmp / "serve.log")
    try:
        yield server
    finally:
        server.stop()
