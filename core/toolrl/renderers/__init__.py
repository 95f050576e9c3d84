"""The chat templates' renderers, below both the rollout loop and the gateway that render with them:
``chat`` (the base: prompts and token deltas), ``families`` (a family's renderer), its own ``mistral``
and ``harmony`` renderers, and ``rewrite`` (templates that rewrite history)."""
