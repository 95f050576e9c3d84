"""pytest plugin for toolrl, loaded automatically wherever toolrl is installed (entry point ``pytest11``):
the fixtures ``toolrl_plugins`` (fresh plugins read from the current environment, ``TOOLRL_*`` variables
set with ``monkeypatch`` included) and ``toolrl_reload_plugins`` (call it after
``monkeypatch.setenv("TOOLRL_DISABLE_PLUGINS", ...)`` so code that uses the process-wide plugins sees
the change), and a report header listing every toolrl plugin with its status, so "my plugin is not
found" shows up in the first lines of a test run. This module is imported by every pytest run in the
environment: it imports only pytest at module level.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING

import pytest

if TYPE_CHECKING:
    from toolrl.plugins import Plugins


@pytest.fixture
def toolrl_plugins() -> Plugins:
    """Freshly loaded plugins (built-ins and entry points), independent of the process-wide ones."""
    # lazy: every pytest run in the environment imports this module (see above)
    from toolrl.plugins import Plugins

    return Plugins()


@pytest.fixture
def toolrl_reload_plugins() -> Iterator[Callable[[], Plugins]]:
    """Reset the process-wide plugins around the test; returns ``get_plugins`` to reload them."""
    # lazy: every pytest run in the environment imports this module (see above)
    from toolrl.plugins import get_plugins, reset_plugins

    reset_plugins()
    yield get_plugins
    reset_plugins()


def pytest_report_header(config: pytest.Config) -> str | None:
    try:
        from toolrl.plugins import Plugins  # lazy: as above, and a broken install is the header's line

        plugins = Plugins(strict=False).list()
    except Exception as exc:  # the header must never break a test run
        return f"toolrl plugins: cannot load ({type(exc).__name__}: {exc})"
    items = []
    for info in plugins:
        label = info.name if info.builtin else f"{info.name} {info.version}"
        if info.status != "ok":
            label += f" [{info.status}{': ' + info.error if info.error else ''}]"
        items.append(label)
    return "toolrl plugins: " + ", ".join(items)
