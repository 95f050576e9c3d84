"""The service computes what toolrl's own step computes: per SDK loss the same loss and gradients as
toolrl's policy_loss on the same tokens and weights (within 1e-6), sample's log-probs those of forward
(1e-5), optim_step toolrl's AdamW step bit for bit, and two clients on one base untouched by each other;
the service on two trainer ranks the same, and per loss what the one-rank service gives (within 1e-6)."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
import torch
from conftest import BASE, KEY, held

TOKENS = [3, 17, 99, 2048, 5, 77, 1023, 64, 8, 300, 41]


def _datum(loss_fn: str, seed: int = 0) -> tuple[Any, dict[str, np.ndarray]]:
    from tinker import types

    rng = np.random.default_rng(seed)
    n = len(TOKENS) - 1
    inputs: dict[str, np.ndarray] = {"target_tokens": np.array(TOKENS[1:], np.int64)}
    if loss_fn == "cross_entropy":
        inputs["weights"] = rng.uniform(0, 1, n).astype(np.float32)
    else:
        inputs["logprobs"] = rng.uniform(-12.5, -11.0, n).astype(np.float32)
        inputs["advantages"] = rng.normal(0, 1, n).astype(np.float32)
    return types.Datum(model_input=types.ModelInput.from_ints(TOKENS[:-1]), loss_fn_inputs=dict(inputs)), inputs


def _adapter_grads(run: Any, trainer: Any) -> dict[str, torch.Tensor]:
    return {n: g for n, g in trainer.gradients(run).items() if g is not None}


def _warm(tc: Any) -> None:
    """One cross_entropy step, so that the adapter's B is not zero (every gradient then is not)."""
    from tinker import types

    datum, _ = _datum("cross_entropy", seed=1)
    tc.forward_backward([datum], "cross_entropy").result()
    tc.optim_step(types.AdamParams(learning_rate=1e-2)).result()


# Each Tinker loss as toolrl's algorithm section (the sum over tokens: seq-mean-token-sum-norm over 1).
ALGOS = {
    "cross_entropy": ("cross_entropy", {}),
    "importance_sampling": ("importance_sampling", {}),
    "ppo": ("ppo_clip", {"clip_eps_low": 0.2, "clip_eps_high": 0.19999999999999996}),
    "cispo": ("cispo", {"min_weight": 0.8, "max_weight": 1.2}),
    "dro": ("dro", {"beta": 0.05}),
}


def _toolrl_step(run: Any, trainer: Any, loss_fn: str,
                 inputs: dict[str, np.ndarray]) -> tuple[float, dict[str, torch.Tensor]]:
    """The same tokens through toolrl's own packing (a trajectory), log-probs and policy loss."""
    from toolrl.algorithms import build_loss
    from toolrl.config import AlgorithmConfig
    from toolrl.modeling.adapter_routing import adapter_names
    from toolrl.training.packing import build_batch, through_adapters
    from toolrl.training.step import policy_loss, response_logprobs
    from toolrl.trajectory import Trajectory

    name, options = ALGOS[loss_fn]
    algo = AlgorithmConfig(loss=name, loss_options=options, loss_agg="seq-mean-token-sum-norm")
    n = len(TOKENS) - 1
    sampled = inputs.get("logprobs", np.zeros(n, np.float32))
    traj = Trajectory(trajectory_id="t", sample_index=0, group=0, prompt_ids=TOKENS[:1], response_ids=TOKENS[1:],
                      response_mask=[1] * n, logprobs=sampled.tolist())
    adv = torch.from_numpy(inputs["weights" if loss_fn == "cross_entropy" else "advantages"])
    model = trainer.ranks.model
    batch = build_batch([traj], [adv], adapters=[adapter_names(model).index(run.adapter)])
    for p in model.parameters():
        p.grad = None
    with through_adapters(model, batch):
        new = response_logprobs(model, batch)
        prox = new.detach() if loss_fn == "cross_entropy" else batch.engine_logprobs
        loss, _ = policy_loss(new, prox, batch, algo, {"seqs": 1.0, "max_len": 1.0, "tokens": 1.0},
                              loss_fn=build_loss(algo))
        loss.backward()
    return float(loss), _adapter_grads(run, trainer)


@pytest.mark.parametrize("loss_fn", list(ALGOS))
def test_forward_backward_equals_toolrl_step(client: Any, served: Any, loss_fn: str) -> None:
    tc = client.create_lora_training_client(base_model=BASE, rank=4, seed=3).result()
    _warm(tc)
    run, trainer = held(served, tc.model_id)
    datum, inputs = _datum(loss_fn)
    out = tc.forward_backward([datum], loss_fn).result()
    served_grads = _adapter_grads(run, trainer)
    assert served_grads and all(g.abs().sum() > 0 for g in served_grads.values())
    loss, grads = _toolrl_step(run, trainer, loss_fn, inputs)
    assert abs(out.metrics["loss:sum"] - loss) <= 1e-6 * max(1.0, abs(loss))
    assert served_grads.keys() == grads.keys()
    for key, g in grads.items():
        torch.testing.assert_close(served_grads[key], g, rtol=0, atol=1e-6)
    for p in trainer.ranks.model.parameters():
        p.grad = None


def forward_logprobs(tc: Any, tokens: list[int]) -> np.ndarray:
    """The training client's log-probs of ``tokens[1:]`` (a forward, cross_entropy)."""
    from tinker import types

    datum = types.Datum(model_input=types.ModelInput.from_ints(tokens[:-1]),
                        loss_fn_inputs={"target_tokens": np.array(tokens[1:], np.int64)})
    return tc.forward([datum], "cross_entropy").result().loss_fn_outputs[0]["logprobs"].to_numpy()


def check_sample_logprobs(client: Any, atol: float) -> None:
    """A trained client's sampler: sample's and compute_logprobs' log-probs those of the client's forward
    within ``atol``; the base model's sampler those of a fresh client (its adapter's B zero)."""
    from tinker import types

    tc = client.create_lora_training_client(base_model=BASE, rank=4, seed=5).result()
    _warm(tc)
    sampler = tc.save_weights_and_get_sampling_client().result()
    prompt = TOKENS[:6]
    res = sampler.sample(types.ModelInput.from_ints(prompt), 2, types.SamplingParams(max_tokens=6, seed=7)).result()
    for seq in res.sequences:
        lps = forward_logprobs(tc, prompt + list(seq.tokens))
        np.testing.assert_allclose(np.asarray(seq.logprobs), lps[len(prompt) - 1:], rtol=0, atol=atol)
    scored = sampler.compute_logprobs(types.ModelInput.from_ints(prompt)).result()
    assert scored[0] is None
    np.testing.assert_allclose(np.asarray(scored[1:], np.float32), forward_logprobs(tc, prompt), rtol=0, atol=atol)
    fresh = client.create_lora_training_client(base_model=BASE, rank=4, seed=6).result()
    base = client.create_sampling_client(base_model=BASE).result().compute_logprobs(types.ModelInput.from_ints(TOKENS)).result()
    np.testing.assert_allclose(np.asarray(base[1:], np.float32), forward_logprobs(fresh, TOKENS), rtol=0, atol=atol)


def test_sample_logprobs_equal_forward(service: Any) -> None:
    check_sample_logprobs(service[1], atol=1e-5)


def test_optim_step_is_toolrl_adamw_bit_for_bit(service: Any) -> None:
    """The step the ranks make from the gradient they hold (on two: summed over both) is torch's AdamW
    step from it, bit for bit."""
    from tinker import types

    served, client = service
    tc = client.create_lora_training_client(base_model=BASE, rank=4, seed=9).result()
    _warm(tc)
    run, trainer = held(served, tc.model_id)
    datum, _ = _datum("importance_sampling")
    tc.forward_backward([datum], "importance_sampling").result()
    weights, grads = trainer.adapter_state(run), trainer.gradients(run)
    before = {k: w.clone().requires_grad_(True) for k, w in weights.items()}
    for key, mine in before.items():
        mine.grad = grads[key].clone()
    mirror = torch.optim.AdamW(list(before.values()), lr=1e-4)
    mirror.load_state_dict(trainer.ranks.state(run.adapter)["optimizer"])  # its moments (a copy)
    params = types.AdamParams(learning_rate=3e-3, beta1=0.8, beta2=0.9, eps=1e-8, weight_decay=0.01,
                              grad_clip_norm=0.5)
    stepped = tc.optim_step(params).result()  # grad_clip_norm on the wire, core's grad_clip on the ranks
    for g in mirror.param_groups:
        g.update(lr=3e-3, betas=(0.8, 0.9), eps=1e-8, weight_decay=0.01)
    norm = float(torch.nn.utils.clip_grad_norm_(list(before.values()), 0.5))
    mirror.step()
    after = trainer.adapter_state(run)
    assert all(torch.equal(mine.detach(), after[key]) for key, mine in before.items())
    assert stepped.metrics["grad_norm:mean"] == pytest.approx(norm, rel=1e-6)


def test_two_clients_on_one_base_leave_each_other_alone(service: Any) -> None:
    from tinker import types

    served, client = service
    a = client.create_lora_training_client(base_model=BASE, rank=4, seed=11).result()
    b = client.create_lora_training_client(base_model=BASE, rank=2, seed=12).result()
    _warm(b)
    (_, trainer), (run_b, trainer_b) = held(served, a.model_id), held(served, b.model_id)
    assert trainer is trainer_b
    weights, moments = trainer.adapter_state(run_b), trainer.ranks.state(run_b.adapter)["optimizer"]["state"]
    for loss_fn in ("cross_entropy", "ppo"):
        datum, _ = _datum(loss_fn)
        a.forward_backward([datum], loss_fn).result()
        a.optim_step(types.AdamParams(learning_rate=1e-2)).result()
    after = trainer.adapter_state(run_b)
    assert all(torch.equal(weights[k], after[k]) for k in weights)
    state = trainer.ranks.state(run_b.adapter)["optimizer"]["state"]
    assert all(torch.equal(t, state[k][n]) for k, v in moments.items() for n, t in v.items())
    assert all(g is None for g in trainer.gradients(run_b).values())


@pytest.mark.parametrize("loss_fn", list(ALGOS))
def test_two_ranks_give_what_one_gives(served: Any, served_two: Any, loss_fn: str) -> None:
    """Per loss, a client of the two-rank service (its rows in two shares, of two rows and one; a request of
    one row runs an idle forward on the other rank; its adapter moved out and back between requests) gets
    what the same client of the one-rank service gets: loss, log-probs, gradients and the step's update
    within 1e-6 (gradients: of the largest one, as float32 sums in another order give them)."""
    import tinker
    from tinker import types

    got = []
    for s in (served, served_two):
        c = tinker.ServiceClient(base_url=s.url, api_key=KEY)  # its session's runs leave at its close
        tc = c.create_lora_training_client(base_model=BASE, rank=4, seed=21).result()
        other = c.create_lora_training_client(base_model=BASE, rank=2, seed=22).result()
        _warm(tc)
        _warm(other)  # on two ranks: tc's adapter out of the model now
        data = [_datum(loss_fn, seed=30 + i)[0] for i in range(3)]
        out = tc.forward_backward(data, loss_fn).result()
        run, trainer = held(s, tc.model_id)
        grads = _adapter_grads(run, trainer)
        tc.optim_step(types.AdamParams(learning_rate=1e-2)).result()
        got.append((out, grads, trainer.adapter_state(run)))
        c.close("success")
    (one, one_grads, one_weights), (two, two_grads, two_weights) = got
    loss = one.metrics["loss:sum"]
    assert abs(two.metrics["loss:sum"] - loss) <= 1e-6 * max(1.0, abs(loss))
    for a, b in zip(one.loss_fn_outputs, two.loss_fn_outputs, strict=True):
        np.testing.assert_allclose(b["logprobs"].to_numpy(), a["logprobs"].to_numpy(), rtol=0, atol=1e-6)
    assert one_grads.keys() == two_grads.keys() and one_grads
    largest = max(1.0, *(float(g.abs().max()) for g in one_grads.values()))
    for key, g in one_grads.items():
        torch.testing.assert_close(two_grads[key], g, rtol=0, atol=1e-6 * largest)
    for key, w in one_weights.items():
        torch.testing.assert_close(two_weights[key], w, rtol=0, atol=1e-6)


def test_forward_backward_custom_equals_cross_entropy(client: Any, served: Any) -> None:
    """The SDK's custom loss (a forward, the loss on the client, its gradient sent back as weights):
    -sum(weights · logprobs) gives cross_entropy's gradients."""
    tc = client.create_lora_training_client(base_model=BASE, rank=4, seed=13).result()
    _warm(tc)
    run, trainer = held(served, tc.model_id)
    datum, inputs = _datum("cross_entropy", seed=4)
    weights = torch.from_numpy(inputs["weights"])

    def loss(data: list[Any], logprobs: list[torch.Tensor]) -> tuple[torch.Tensor, dict[str, float]]:
        total = -(logprobs[0] * weights).sum()
        return total, {"custom_loss": float(total)}

    out = tc.forward_backward_custom([datum], loss).result()
    custom = _adapter_grads(run, trainer)
    ce_loss, grads = _toolrl_step(run, trainer, "cross_entropy", inputs)
    assert abs(out.metrics["custom_loss"] - ce_loss) <= 1e-5 * max(1.0, abs(ce_loss))
    for key, g in grads.items():
        torch.testing.assert_close(custom[key], g, rtol=0, atol=1e-6)
    for p in trainer.ranks.model.parameters():
        p.grad = None


def _request(loss_fn: str, model_id: str) -> Any:
    """Eight datums of 3 to 10 tokens (45 in all), as the wire hands them to the service."""
    from toolrl_tinker.requests import Datum, ForwardBackward

    data = []
    for i, n in enumerate([10, 3, 7, 4, 9, 5, 3, 4]):
        inputs = _datum(loss_fn, seed=10 + i)[1]
        data.append(Datum(np.array(TOKENS[:n], np.int64), {k: v[:n] for k, v in inputs.items()}))
    return ForwardBackward(model_id, None, loss_fn, None, False, data)


@pytest.mark.parametrize("loss_fn", ["cross_entropy", "ppo"])
def test_micro_batched_request_equals_one_pass(client: Any, served: Any, loss_fn: str) -> None:
    """A request split into micro-batches (``--micro-batch-tokens``) gives the one pass's loss,
    log-probs and gradients, and no forward holds more tokens than the limit (the forwards the model
    ran, seen at its embedding)."""
    from toolrl_tinker.requests import token_rows

    tc = client.create_lora_training_client(base_model=BASE, rank=4, seed=3).result()
    _warm(tc)
    run, trainer = held(served, tc.model_id)
    rows, loss = token_rows(_request(loss_fn, tc.model_id), trainer.vocab, 4096)
    seen: list[int] = []
    hook = trainer.ranks.model.get_input_embeddings().register_forward_hook(lambda m, args, out: seen.append(args[0].shape[-1]))
    results = []
    try:
        for micro in (4096, 13):
            out = trainer.step(run, rows, loss, False, micro)
            results.append((out.logprobs, out.loss, _adapter_grads(run, trainer)))
            for p in trainer.ranks.model.parameters():
                p.grad = None
    finally:
        hook.remove()
    assert seen == [45, 13, 11, 9, 12]
    (whole_lps, whole, whole_grads), (split_lps, split, split_grads) = results
    assert abs(split - whole) <= 1e-6 * max(1.0, abs(whole))
    for a, b in zip(whole_lps, split_lps, strict=True):
        np.testing.assert_allclose(b, a, rtol=0, atol=1e-6)
    assert whole_grads.keys() == split_grads.keys() and whole_grads
    for key, g in whole_grads.items():  # float32 sums in another order: 1e-6 of the tensor's largest gradient
        torch.testing.assert_close(split_grads[key], g, rtol=0, atol=1e-6 * max(1.0, float(g.abs().max())))
