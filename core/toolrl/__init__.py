"""toolrl: reinforcement learning for LLMs that call tools. A plugin imports the names docs/plugins.md lists
("Public import paths"), :data:`hookimpl` and :class:`InfrastructureError` here among them. Heavy
libraries are imported only where used."""

from toolrl.hookspecs import hookimpl


class InfrastructureError(RuntimeError):
    """A failure of the infrastructure, not of the model: a sandbox or environment server that cannot
    be reached or died, a connection lost, the environment's own deadline. Raise it (or a subclass)
    from a tool's lifecycle methods or an environment session's methods; the trajectory then ends with
    termination ``infra_error`` and is left out of the loss and out of its group's baseline
    (:mod:`toolrl.data.batches`), never scored as a wrong answer. The model's own errors (a bad call,
    code that raises or runs past its time limit) are ordinary errors: the model reads them. Defined
    here, beside ``hookimpl``, so that raising it imports nothing (``toolrl.schemas`` re-exports it)."""


__all__ = ["InfrastructureError", "hookimpl"]
__version__ = "0.1.0"
