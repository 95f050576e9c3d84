"""The embedded sandbox: isolated, pre-started interpreter processes, one per run."""

from toolrl_sandbox_fusion.embedded.launch import SandboxLimits
from toolrl_sandbox_fusion.embedded.sandbox import EmbeddedSandbox, SandboxConfig

__all__ = ["EmbeddedSandbox", "SandboxConfig", "SandboxLimits"]
