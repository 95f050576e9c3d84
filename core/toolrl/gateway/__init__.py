"""The gateway: agent programs' model calls, recorded as trajectories that train what the engine sampled.

An agent (:mod:`toolrl.agents`, ``rollout.agent``) runs each episode itself against an endpoint of the
episode's own, served here on loopback (:mod:`~toolrl.gateway.server`): OpenAI Chat Completions
(``chat_completions``) and Responses (``responses``), and a plugin's APIs (Anthropic Messages), each a
gateway protocol (:mod:`~toolrl.gateway.protocols`). A call renders its messages with the family's template,
generates with the engine being trained and parses calls with the family's parser (``session``); the
calls of one episode become one trajectory, continued from the sampled tokens wherever the program's
messages continue them, a new segment wherever they do not (:mod:`~toolrl.gateway.record`). :func:`toolrl.gateway.run.run_agent_episode` is one episode, which the
rollout loop (:mod:`toolrl.rollout`) runs and scores. docs/agents.md is the user's page.
"""
