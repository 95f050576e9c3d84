"""Templates that rewrite history: detecting them on every turn, and the rules for what to do.

A template *rewrites history* when its rendering of the conversation so far is not the trajectory's
tokens (Qwen3 drops earlier ``<think>`` blocks, gpt-oss the analysis channel, text re-tokenizes to other
ids), so the model continues from a context serving would never give it. After each round of tool results
the conversation is re-rendered and compared; what each ``rollout.template_rewrite`` rule then does:
docs/models.md, "Templates that rewrite history".
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
