"""This process's connection to Ray: :func:`init_ray`, the one place Ray is started or joined (a run's
processes, the rollout pool on its own, the public step group, a weight receiver joining its sender's
cluster, the tests). It sits below every part so that connecting to Ray loads neither the rollout stack
(engines, tools) nor the trainer's.

``ray`` is imported only inside the function.
"""

from __future__ import annotations

import logging
import math
import os
from typing import Any

__all__ = ["init_ray"]

log = logging.getLogger(__name__)


def init_ray(address: str, cpus_needed: float, **options: Any) -> None:
    """Connect this process to Ray (``options``: more of ``ray.init``'s): ``"local"`` starts a private
    instance on this machine with at least ``cpus_needed`` logical CPUs (so a laptop can run more actors
    than it has cores), or ``options["num_cpus"]`` when given. Ray gives a starting node 30 s to register;
    on a machine busy enough that it misses that, the local instance is started once more (said in the log)."""
    import ray

    options = {"include_dashboard": False, **options}
    if address == "local" and "num_cpus" not in options:
        options["num_cpus"] = max(os.cpu_count() or 1, math.ceil(cpus_needed))
    for attempt in (1, 2):
        try:
            ray.init(address=address, **options)
            return
        except Exception as exc:  # Ray raises a bare Exception for a node that timed out starting
            if address != "local" or attempt == 2 or "timed out during startup" not in str(exc):
                raise
            log.warning("Ray's local node timed out starting (a busy machine); starting it once more")
            ray.shutdown()
