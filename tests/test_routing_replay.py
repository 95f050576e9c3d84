"""Routing replay on a tiny random mixture-of-experts model (Qwen3-MoE shapes: 4 layers, 16 experts,
top-4): the transformers engine records every token's experts, and the trainer replays them (r3) or
its own first pass's (r2). The engine runs in bfloat16 and the trainer in float32, as users run them,
so their routed experts differ without replay. What the experts ran on is read from the experts modules'
inputs, not from the replay code."""

from __future__ import annotations

import asyncio

import pytest
import torch
from toolrl import model_sources
from toolrl.config import AlgorithmConfig, ConfigError, OptimConfig, load_config
from toolrl.engines import SamplingParams
from toolrl.engines.transformers import TransformersEngine, TransformersEngineConfig
from toolrl.model_sources import load_model, tiny_moe
from toolrl.modeling.expert_routing import ExpertRouting
from toolrl.training.packing import build_batch, packed_hidden_states
from toolrl.training.step import StepOptions, response_logprobs, train_step
from toolrl.trajectory import RoutedExperts, Trajectory

PROMPTS = [list(range(100 + 50 * g, 140 + 50 * g)) for g in range(2)]  # 40 tokens: a shared prefix


@pytest.fixture(scope="module")
def moe_path():
    return tiny_moe(num_hidden_layers=4, num_experts=16, num_experts_per_tok=4)


def generate(engine, prompts, n, max_new_tokens=16, **kwargs):
    async def run():
        return await asyncio.gather(*[engine.generate(p, SamplingParams(max_new_tokens=max_new_tokens, seed=g), n,
                                                      **kwargs) for g, p in enumerate(prompts)])
    return asyncio.run(run())


@pytest.fixture(scope="module")
def engine_trajectories(moe_path):
    """Two groups of four, sampled by a bfloat16 engine recording experts; rewards that differ in each group."""
    engine = TransformersEngine(load_model(moe_path, dtype="bfloat16"), model_sources.load_tokenizer(moe_path),
                                TransformersEngineConfig(record_routes=True, seed=0))
    trajs = []
    for g, gens in enumerate(generate(engine, PROMPTS, 4)):
        for k, gen in enumerate(gens):
            trajs.append(Trajectory(trajectory_id=f"{g}-{k}", sample_index=k, group=g, prompt_ids=PROMPTS[g],
                                    response_ids=gen.token_ids, response_mask=[1] * len(gen.token_ids),
                                    logprobs=gen.logprobs, reward=float(k % 2), routed_experts=gen.routed_experts))
    return trajs


class ExpertInputs:
    """The expert ids each forward's experts modules were given, (tokens, layers, top_k) per forward;
    ``routers=True``: the ids the routers chose themselves (hooked before any replay is)."""

    def __init__(self, model, routers=False):
        suffix = "TopKRouter" if routers else "Experts"
        self.layers = [m for m in model.modules() if type(m).__name__.endswith(suffix)]
        self.calls: list[torch.Tensor] = []
        self.pending: list[torch.Tensor] = []
        for m in self.layers:
            if routers:
                m.register_forward_hook(lambda module, args, out: self.hook(module, (None, out[2])))
            else:
                m.register_forward_pre_hook(self.hook)

    def hook(self, module, args):
        self.pending.append(args[1].detach().clone())
        if len(self.pending) == len(self.layers):
            self.calls.append(torch.stack(self.pending, dim=1))
            self.pending = []


def differ(a, b):
    """Per token: True where any layer's set of experts differs."""
    return (a.sort(-1).values != b.sort(-1).values).any(-1).any(-1)


def test_the_engine_records_every_token_it_runs(moe_path):
    """Prompt tokens (shared by a group's samples, or kept from a session's last turn) and every fed
    generated token: the ids a plain float32 forward of the same tokens chooses."""
    model = load_model(moe_path)
    engine = TransformersEngine(model, model_sources.load_tokenizer(moe_path), TransformersEngineConfig(record_routes=True, seed=0))
    first = generate(engine, PROMPTS[:1], 2, 6)[0] + generate(engine, [PROMPTS[1]], 1, 6, session_id="s")[0]
    follow = PROMPTS[1] + first[2].token_ids + [7, 8]
    second = generate(engine, [follow], 1, 5, session_id="s")[0][0]
    assert second.prefill_tokens_saved > 0  # the session's KV, and so its routed experts, were reused
    plain = ExpertRouting(model)
    for tokens, gen in [(PROMPTS[0], first[0]), (PROMPTS[0], first[1]), (PROMPTS[1], first[2]), (follow, second)]:
        run = tokens + gen.token_ids[:-1]
        plain.replay(None)
        with torch.no_grad():
            model(torch.tensor([run]))
        assert gen.routed_experts.tokens == len(run) and (gen.routed_experts.layers, gen.routed_experts.top_k) == (4, 4)
        assert (gen.routed_experts.array() == plain.recorded().numpy()).all()


@pytest.mark.parametrize("share", [False, True], ids=["packed", "prefix-tree"])
def test_r3_routes_the_trainer_as_the_engine_on_every_token(moe_path, engine_trajectories, share):
    model = load_model(moe_path)
    seen, chose = ExpertInputs(model), ExpertInputs(model, routers=True)
    batch = build_batch(engine_trajectories, [0.0] * len(engine_trajectories), share_prefixes=share)
    assert (batch.tokens < batch.total_tokens) == share
    with torch.no_grad():
        packed_hidden_states(model, batch)
    assert differ(seen.calls[-1], batch.routed_experts).any()  # bf16 engine, fp32 trainer: experts differ
    algo = AlgorithmConfig(routing_replay="r3")
    options = StepOptions(algo, OptimConfig(micro_batch_size=8, share_prefixes=share), pad_id=0, temperature=1.0,
                          max_response_tokens=16)
    seen.calls.clear()
    chose.calls.clear()
    metrics = train_step(model, torch.optim.SGD(model.parameters(), lr=0.0), engine_trajectories, options)
    assert len(seen.calls) == 1 and torch.equal(seen.calls[0], batch.routed_experts)  # the gradient pass, every token
    # The routers' own choice at each layer of the replayed forward: the tokens where it was overruled.
    assert metrics["routing_mismatch_frac"] == pytest.approx(float(differ(chose.calls[0], batch.routed_experts).float().mean()))
    assert metrics["routing_mismatch_frac"] > 0
    assert metrics["loss_tokens"] == sum(len(t.response_ids) for t in engine_trajectories)


@pytest.mark.parametrize("norm_topk_prob", [True, False])
def test_r3_gives_a_float32_engine_its_own_logprobs(moe_path, norm_topk_prob):
    """Engine and trainer in float32 route alike, so replaying the engine's experts must change nothing:
    the trainer's log-probs of the sampled tokens equal the engine's with R3, on the prefix-shared batch,
    with the router's top-k weights renormalised or not (a replay shifted by a token, or weighting the
    forced experts otherwise than the router, would move them)."""
    engine_model, model = load_model(moe_path), load_model(moe_path)
    for m in (engine_model, model):
        for router in ExpertRouting(m).routers:
            router.norm_topk_prob = norm_topk_prob
    engine = TransformersEngine(engine_model, model_sources.load_tokenizer(moe_path),
                                TransformersEngineConfig(record_routes=True, seed=0))
    trajs = [Trajectory(trajectory_id=f"{g}-{k}", sample_index=k, group=g, prompt_ids=PROMPTS[g],
                        response_ids=gen.token_ids, response_mask=[1] * len(gen.token_ids), logprobs=gen.logprobs,
                        routed_experts=gen.routed_experts)
             for g, gens in enumerate(generate(engine, PROMPTS, 2, 8)) for k, gen in enumerate(gens)]
    batch = build_batch(trajs, [0.0] * len(trajs), share_prefixes=True)
    replay = ExpertRouting(model)
    replay.replay(batch.routed_experts)
    with torch.no_grad():
        lp = response_logprobs(model, batch)
    assert not replay.flips.any()  # the trainer's routers chose the engine's experts themselves
    mask = batch.response_mask.bool()
    assert (lp - batch.engine_logprobs)[mask].abs().max() < 1e-4
    for router in replay.routers:  # a weighting the router does not use is seen
        router.norm_topk_prob = not norm_topk_prob
    with torch.no_grad():
        assert (response_logprobs(model, batch) - batch.engine_logprobs)[mask].abs().max() > 1e-3


class Recorder(torch.optim.Optimizer):
    """Keeps each update's gradients by parameter name instead of applying them."""

    def __init__(self, model):
        self.names = {p: n for n, p in model.named_parameters()}
        super().__init__(model.parameters(), {})
        self.grads: list[dict[str, torch.Tensor]] = []

    def step(self, closure=None):
        self.grads.append({self.names[p]: p.grad.clone() for g in self.param_groups for p in g["params"]
                           if p.grad is not None})


def test_gradients_reach_the_router_with_r3(moe_path, engine_trajectories):
    model = load_model(moe_path)
    opt = Recorder(model)
    options = StepOptions(AlgorithmConfig(routing_replay="r3"), OptimConfig(micro_batch_size=4), pad_id=0,
                          temperature=1.0, max_response_tokens=16)
    metrics = train_step(model, opt, engine_trajectories, options)
    routers = {n: g for n, g in opt.grads[0].items() if n.endswith("gate.weight")}
    assert len(routers) == 4 and all(torch.isfinite(g).all() and g.abs().sum() > 0 for g in routers.values())
    assert metrics["grad_norm"] > 0 and torch.isfinite(torch.tensor(metrics["loss"]))


@pytest.mark.parametrize("mode", ["off", "r2"])
def test_r2_routes_every_forward_as_the_first(moe_path, engine_trajectories, mode):
    """Two epochs with a large step: the weights move between them, and so does the routing unless r2
    replays the first (proximal) pass's."""
    model = load_model(moe_path)
    seen = ExpertInputs(model)
    options = StepOptions(AlgorithmConfig(routing_replay=mode, ppo_epochs=2), OptimConfig(micro_batch_size=8),
                          pad_id=0, temperature=1.0, max_response_tokens=16)
    train_step(model, torch.optim.Adam(model.parameters(), lr=0.05), engine_trajectories, options)
    first, *later = seen.calls  # the proximal pass, then one gradient pass an epoch
    assert len(later) == 2
    assert torch.equal(later[0], first)  # the weights have not moved yet
    assert torch.equal(later[1], first) == (mode == "r2")


def test_routing_replay_needs_a_recording_engine_and_an_moe_model(tiny_qwen3_path, engine_trajectories):
    from toolrl.algorithms.rules import check_algorithm

    def config(*overrides):
        return load_config(None, ["algorithm.routing_replay=r3", *overrides], data={"env": "arithmetic"})

    cases = {(): "set engine.options.record_routes: true",
             ("engine.name=vllm",): r"engine.name=vllm: this engine does not return the experts .*\(vLLM returns "
                                    r"them, enable_return_routed_experts, only from its V2 model runner, which needs Triton"}
    for overrides, message in cases.items():
        with pytest.raises(ConfigError, match=message) as info:
            check_algorithm(config(*overrides))
        assert "\n" not in str(info.value)
    check_algorithm(config("engine.options.record_routes=true"))
    dense = load_model(tiny_qwen3_path)
    options = StepOptions(AlgorithmConfig(routing_replay="r2"), OptimConfig(), pad_id=0, temperature=1.0,
                          max_response_tokens=16)
    with pytest.raises(ConfigError, match="^algorithm.routing_replay: Qwen3ForCausalLM has no mixture-of-experts"):
        train_step(dense, torch.optim.SGD(dense.parameters(), lr=0.0), engine_trajectories, options)


def test_r3_refuses_trajectories_without_routed_experts(moe_path, engine_trajectories):
    model = load_model(moe_path)
    bare = [t.model_copy(update={"routed_experts": None}) for t in engine_trajectories]
    options = StepOptions(AlgorithmConfig(routing_replay="r3"), OptimConfig(), pad_id=0, temperature=1.0,
                          max_response_tokens=16)
    with pytest.raises(ValueError, match="a trajectory of the batch has no recorded experts"):
        train_step(model, torch.optim.SGD(model.parameters(), lr=0.0), bare, options)


def test_routed_experts_are_one_byte_an_expert_and_survive_json(engine_trajectories):
    t = engine_trajectories[0]
    assert len(t.routed_experts.ids) == t.routed_experts.tokens * 4 * 4  # tokens × layers × top_k, one byte each
    back = Trajectory.model_validate_json(t.model_dump_json())
    assert back.routed_experts == t.routed_experts and (back.routed_experts.array() == t.routed_experts.array()).all()
    assert t.routed_experts.width == 1 and '"width":1' in t.model_dump_json()
    assert '"routes":{"layers":4' in t.model_dump_json()  # the name saved files hold it by
    for bad in (-1, 65536):
        with pytest.raises(ValueError, match=r"ids in \[0, 65535\]"):
            RoutedExperts.of(torch.full((2, 1, 2), bad))


def test_more_than_256_experts_take_two_bytes_an_id():
    """A model with 300 experts a layer (Kimi-K2 has 384): the engine records ids beyond a byte, the
    record keeps them in two bytes each and the trainer's batch replays them as they were."""
    from toolrl.tiny_settings import QWEN_VOCAB
    from transformers import Qwen3MoeConfig, Qwen3MoeForCausalLM

    torch.manual_seed(0)
    model = Qwen3MoeForCausalLM(Qwen3MoeConfig(
        vocab_size=QWEN_VOCAB, hidden_size=64, num_hidden_layers=2, num_attention_heads=2, num_key_value_heads=1,
        head_dim=32, num_experts=300, num_experts_per_tok=4, moe_intermediate_size=8, norm_topk_prob=True))
    engine = TransformersEngine(model, model_sources.load_tokenizer(tiny_moe()), TransformersEngineConfig(record_routes=True, seed=0))
    gen = generate(engine, PROMPTS[:1], 1, 4)[0][0]
    run = PROMPTS[0] + gen.token_ids[:-1]
    plain = ExpertRouting(model)
    plain.replay(None)
    with torch.no_grad():
        model(torch.tensor([run]))
    assert gen.routed_experts.width == 2 and len(gen.routed_experts.ids) == len(run) * 2 * 4 * 2
    assert (gen.routed_experts.array() == plain.recorded().numpy()).all() and gen.routed_experts.array().max() >= 256
    traj = Trajectory(trajectory_id="t", sample_index=0, group=0, prompt_ids=PROMPTS[0], response_ids=gen.token_ids,
                      response_mask=[1] * len(gen.token_ids), logprobs=gen.logprobs, routed_experts=gen.routed_experts)
    back = Trajectory.model_validate_json(traj.model_dump_json())
    assert torch.equal(build_batch([back], [0.0]).routed_experts, plain.recorded())
