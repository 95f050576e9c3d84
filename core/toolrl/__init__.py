"""toolrl: reinforcement learning for LLMs that call tools.

Public plugin API: :data:`hookimpl` (decorate hook implementations), :mod:`toolrl.tools` (the
``Tool`` base class), :mod:`toolrl.schemas` (pydantic models at the boundaries), :mod:`toolrl.parsers`,
:mod:`toolrl.rewards`, :mod:`toolrl.engines`, :mod:`toolrl.environments`, :mod:`toolrl.loggers`
(docs/plugins.md lists them all), and :class:`InfrastructureError` (a failure of the environment,
not of the model: never a reward). Heavy libraries are imported only where used.
"""

from toolrl.hookspecs import hookimpl
from toolrl.schemas import InfrastructureError

__all__ = ["InfrastructureError", "hookimpl"]
__version__ = "0.1.0"
