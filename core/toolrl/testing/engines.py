"""The conformance kit for rollout engines: the engine contract checked against the model itself (a Hugging
Face causal LM on the same weights, full forwards without a KV cache); :func:`check_engine_contract` runs the
async ``check_engine_*`` functions. A check that cannot hold by design is named in ``not_applicable`` with the
reason, and must then fail on the engine (an exemption whose check passes is an error), so nothing is left
out silently.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import Any

from toolrl.engines import Generation, RolloutEngine, SamplingParams
from toolrl.transports.weight_rows import load_rows, whole

GREEDY = SamplingParams(temperature=0.0, max_new_tokens=8)
BESIDE = SamplingParams(temperature=0.0, max_new_tokens=64)  # requests running beside a cancelled one
CANCELLED = SamplingParams(temperature=0.0, max_new_tokens=400)  # long enough to be cut mid-generation


def reference_greedy(model: Any, prompt: Sequence[int], steps: int) -> tuple[list[int], list[float]]:
    """Greedy decoding by full forwards over the whole sequence (no cache): the tokens and each one's
    log-probability."""
    import torch

    ids, tokens, logprobs = list(prompt), [], []
    with torch.no_grad():
        for _ in range(steps):
            logits = model(torch.tensor([ids])).logits[0, -1].float()
            token = int(logits.argmax())
            tokens.append(token)
            logprobs.append(float(torch.log_softmax(logits, -1)[token]))
            ids.append(token)
    return tokens, logprobs


async def check_engine_logprobs(engine: RolloutEngine, model: Any, prompts: Sequence[Sequence[int]],
                                params: SamplingParams = GREEDY, atol: float = 1e-3) -> None:
    """Each prompt's greedy generation (all prompts at once, as rollouts send them) equals the
    reference token for token, with logprobs within ``atol``."""
    got: list[Generation] = [g[0] for g in await asyncio.gather(*(engine.generate(list(p), params, 1) for p in prompts))]
    for i, (prompt, generation) in enumerate(zip(prompts, got)):
        tokens, logprobs = reference_greedy(model, prompt, len(generation.token_ids))
        assert generation.token_ids == tokens, f"prompt {i}: generated {generation.token_ids}, the model gives {tokens}"
        assert len(generation.logprobs) == len(tokens), f"prompt {i}: {len(generation.logprobs)} logprobs for " \
                                                        f"{len(tokens)} tokens"
        worst = max((abs(a - b) for a, b in zip(generation.logprobs, logprobs)), default=0.0)
        assert worst <= atol, f"prompt {i}: logprobs differ from the model's by up to {worst:.2e} (> {atol:g})"


async def check_engine_cancellation(engine: RolloutEngine, prompts: Sequence[Sequence[int]],
                                    params: SamplingParams = BESIDE) -> None:
    """The first prompt's request is cancelled while it generates; the others, running beside it,
    give what they give alone, and the engine serves a request afterwards."""
    alone = [(await engine.generate(list(p), params, 1))[0].token_ids for p in prompts[1:]]
    doomed = asyncio.ensure_future(engine.generate(list(prompts[0]), CANCELLED, 1))
    others = [asyncio.ensure_future(engine.generate(list(p), params, 1)) for p in prompts[1:]]
    await asyncio.sleep(0.05)  # generating
    doomed.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await doomed
    beside = [(await o)[0].token_ids for o in others]
    assert beside == alone, "requests running beside a cancelled one gave other tokens than alone"
    after = (await engine.generate(list(prompts[0]), params, 1))[0]
    assert after.token_ids, "the engine gave nothing after a cancellation"


async def check_engine_weight_update(engine: RolloutEngine, model: Any, prompts: Sequence[Sequence[int]],
                                     change: Callable[[dict[str, Any]], dict[str, Any]] | None = None) -> None:
    """Changed weights (default: noise on every MLP down-projection) loaded as rows, the one way weights
    reach an engine (``load_weight_rows``, ``finish_weight_rows``), make the engine generate what the
    model with those weights generates. ``model`` is changed in place to be
    that reference: give the engine its own copy of the weights (not a shared module)."""
    import torch

    state = {k: v.detach().clone() for k, v in model.state_dict().items()}
    new = change(state) if change is not None else _perturbed(state)
    with torch.no_grad():
        model.load_state_dict(new, strict=False)
    with engine.updating_weights(engine.weight_version + 1):
        load_rows([engine], whole(new))
    await check_engine_logprobs(engine, model, prompts)


async def check_engine_contract(engine: RolloutEngine, model: Any, prompts: Sequence[Sequence[int]],
                                not_applicable: Mapping[str, str] | None = None) -> dict[str, str]:
    """Every check in order (the weight update last: it changes ``model``), each one named in
    ``not_applicable`` (check -> why it cannot hold for this engine) checked to fail instead.
    Returns each check's outcome: ``passed``, or ``not applicable: <why>``."""
    checks: dict[str, Callable[[], Awaitable[None]]] = {
        "logprobs": lambda: check_engine_logprobs(engine, model, prompts),
        "cancellation": lambda: check_engine_cancellation(engine, prompts),
        "weight_update": lambda: check_engine_weight_update(engine, model, prompts),
    }
    exempt = dict(not_applicable or {})
    unknown = sorted(set(exempt) - set(checks))
    assert not unknown, f"not_applicable names no check: {', '.join(unknown)} (checks: {', '.join(checks)})"
    assert all(why.strip() for why in exempt.values()), "each not_applicable check needs its reason"
    outcome = {}
    for name, check in checks.items():
        if name not in exempt:
            await check()
            outcome[name] = "passed"
            continue
        try:
            await check()
        except AssertionError:
            outcome[name] = f"not applicable: {exempt[name]}"
            continue
        raise AssertionError(f"check {name!r} is declared not applicable ({exempt[name]}) but passes: "
                             "remove it from not_applicable")
    return outcome


def _perturbed(state: dict[str, Any]) -> dict[str, Any]:
    import torch

    generator = torch.Generator().manual_seed(0)
    return {k: v + 0.5 * torch.randn(v.shape, generator=generator, dtype=v.dtype)
            for k, v in state.items() if v.is_floating_point() and k.endswith("mlp.down_proj.weight")}
