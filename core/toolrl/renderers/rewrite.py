"""Templates that rewrite history: detecting them on every turn, and the rules for what to do.

A trajectory's tokens are the prompt, the model's tokens and the template's tool-result deltas. A
template *rewrites history* when its rendering of the conversation so far is not those tokens:
Qwen3 re-formats or drops earlier ``<think>`` blocks, gpt-oss drops the analysis channel, and any
generated text the tokenizer would split differently re-tokenizes to other ids. The model then
continues from a context that serving the same conversation would never give it. After each round
of tool results the conversation is re-rendered and compared; what each ``rollout.template_rewrite``
rule (``keep``, ``training_template``, ``fork``, ``refuse``) then does: docs/models.md, "Templates that
rewrite history". A forked trajectory's pieces share ``trajectory_key``; the step's advantages count a
trajectory once (:func:`toolrl.training.step.token_advantages`).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from toolrl.trajectory import common_prefix


class TemplateRewriteError(RuntimeError):
    """``template_rewrite: refuse`` and the template rewrote the conversation's history."""


def first_difference(rendered: Sequence[int], live: Sequence[int]) -> int | None:
    """The first position where the re-rendered conversation and the trajectory's tokens differ;
    None when they are the same."""
    common = common_prefix(rendered, live)
    return None if common == len(rendered) == len(live) else common


def refusal(turn: int, position: int, rendered: Sequence[int], live: Sequence[int],
            decode: Callable[[Sequence[int]], str]) -> TemplateRewriteError:
    start = max(0, position - 8)
    return TemplateRewriteError(
        f"turn {turn}: the chat template re-renders the conversation differently from the trajectory's "
        f"tokens at token {position} (template {decode(rendered[start:position + 8])!r}, trajectory "
        f"{decode(live[start:position + 8])!r}); set rollout.template_rewrite to fork or training_template")
