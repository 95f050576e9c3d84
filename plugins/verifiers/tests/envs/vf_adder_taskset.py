"""The adder taskset as verifiers resolves a taskset id: a module exporting its Taskset in ``__all__``
(no ``load_environment``)."""

from vf_adder_env import AdderTaskset

__all__ = ["AdderTaskset"]
