"""Several LoRA adapters on one base (model.adapters): apply_adapters injects one per role, routed sends each
token (or row) through its own adapter, exactly as a model with that adapter merged, and an adapter with no
token in a forward takes no part in it."""

from __future__ import annotations

import re

import pytest
import torch
from test_lora import draw_adapters
from toolrl.config import AdapterConfig, ConfigError
from toolrl.model_sources import load_model
from toolrl.modeling import adapter_routing as routing
from toolrl.modeling.adapter_routing import adapter_names, routed
from toolrl.modeling.adapters import (
    adapter_name,
    adapter_of,
    adapter_parameters,
    adapter_state,
    add_adapter,
    apply_adapters,
    apply_lora,
    load_adapter_state,
    remove_adapter,
)

# Different ranks, scalings and targets: "a" adapts only q/v, "b" every Linear, "c" is frozen.
ROLES = {"a": AdapterConfig(r=4, alpha=8, target_modules=["q_proj", "v_proj"]),
         "b": AdapterConfig(r=8, alpha=32),
         "c": AdapterConfig(r=2, alpha=2, frozen=True)}


def routed_model(path: str, seed: int = 0) -> torch.nn.Module:
    """The tiny model with the three adapters, their A and B drawn from ``seed``."""
    return draw_adapters(apply_adapters(load_model(path), ROLES), seed)


def merged_model(path: str, model: torch.nn.Module, role: str) -> torch.nn.Module:
    """A plain model (no peft) whose weights are the base ones with ``role``'s adapter merged in."""
    from peft.tuners.lora import LoraLayer

    plain = load_model(path)
    own = dict(plain.named_parameters())
    with torch.no_grad():
        for name, layer in model.named_modules():
            if isinstance(layer, LoraLayer) and role in layer.lora_A:
                a, b = layer.lora_A[role].weight, layer.lora_B[role].weight
                own[f"{name}.weight"].add_(layer.scaling[role] * b @ a)
    return plain


def prompts(rows: int, tokens: int, seed: int = 1) -> torch.Tensor:
    return torch.randint(0, 1000, (rows, tokens), generator=torch.Generator().manual_seed(seed))


def test_apply_adapters_names_roles_and_freezes_the_frozen(tiny_qwen3_path):
    model = apply_adapters(load_model(tiny_qwen3_path), ROLES)
    assert adapter_names(model) == ["a", "b", "c"]
    trained = {(n.split(".")[-2], p.requires_grad) for n, p in model.named_parameters() if "lora_" in n}
    assert trained == {("a", True), ("b", True), ("c", False)}
    assert all("lora_" in n for n, p in model.named_parameters() if p.requires_grad)
    # model.lora stays the one adapter "default", forwarded by peft as before (no routing).
    single = apply_lora(load_model(tiny_qwen3_path), ROLES["a"])
    assert adapter_names(single) == ["default"]
    single(input_ids=prompts(1, 4))
    with pytest.raises(ValueError, match="no routed adapters"), routed(single, torch.zeros(1, dtype=torch.long)):
        pass


@pytest.mark.parametrize("role, targets, message", [
    ("planner", ["nope"], "model.adapters.planner.target_modules: Target modules {'nope'} not found"),
    ("judge", ["lm_head"], "model.adapters.judge.target_modules: ['lm_head'] matches modules that share a tied"),
    ("v1.5", "all-linear", "model.adapters.v1.5: an adapter's name is part of torch's module names, which cannot be "
                           "empty or contain '.'"),
])
def test_bad_adapters_name_the_role(tiny_qwen3_path, role, targets, message):
    with pytest.raises(ConfigError) as info:
        apply_adapters(load_model(tiny_qwen3_path), {"ok": AdapterConfig(), role: AdapterConfig(target_modules=targets)})
    assert message in str(info.value) and "\n" not in str(info.value)


# Rows of 5 tokens and of 40 take the grouped path (a row per adapter: no padding); gradients, and groups too
# uneven, the per-adapter one (below).
@pytest.mark.parametrize("tokens", [5, 40])
def test_each_row_equals_its_adapter_merged_and_minus_one_the_base(tiny_qwen3_path, tokens):
    model = routed_model(tiny_qwen3_path)
    ids = prompts(4, tokens)
    rows = torch.tensor([1, -1, 0, 2])
    with torch.no_grad(), routed(model, rows):
        out = model(input_ids=ids).logits
    with torch.no_grad(), routed(model, rows[:, None].expand(4, tokens)):  # the same route, per token
        per_token = model(input_ids=ids).logits
    torch.testing.assert_close(per_token, out, rtol=0, atol=1e-5)
    with torch.no_grad():
        for i, role in [(0, "b"), (2, "a"), (3, "c")]:
            ref = merged_model(tiny_qwen3_path, model, role)(input_ids=ids[i : i + 1]).logits
            torch.testing.assert_close(out[i : i + 1], ref, rtol=0, atol=1e-5)
        base = load_model(tiny_qwen3_path)(input_ids=ids[1:2]).logits
    torch.testing.assert_close(out[1:2], base, rtol=0, atol=1e-5)
    # Every row through one adapter (no index, no mask) is that adapter merged as well.
    with torch.no_grad(), routed(model, torch.ones(4, dtype=torch.long)):
        alone = model(input_ids=ids).logits
    with torch.no_grad():
        torch.testing.assert_close(alone, merged_model(tiny_qwen3_path, model, "b")(input_ids=ids).logits,
                                   rtol=0, atol=1e-5)


@pytest.mark.parametrize(("tokens", "uneven"), [(3, False), (100, False), (100, True)])
def test_a_layer_routes_each_token_to_its_own_adapter(tiny_qwen3_path, tokens, uneven):
    # Per token, mixed inside a row: the layer's output is the base's plus that token's adapter delta. Mixed
    # evenly, 200 tokens take the grouped path; with a's 190 beside b's and c's few, the per-adapter one.
    model = routed_model(tiny_qwen3_path)
    layer = model.model.layers[0].self_attn.q_proj  # holds a, b and c
    x = torch.randn(2, tokens, layer.in_features, generator=torch.Generator().manual_seed(3))
    ids = torch.randint(-1, 3, (2, tokens), generator=torch.Generator().manual_seed(4))
    if uneven:
        ids[:, 5:] = 0
    with torch.no_grad(), routed(model, ids):
        out = layer(x)
        grouped = layer.__dict__[routing._ROUTE]._groups
    assert list(grouped.values()) == [None] if uneven else all(g is not None for g in grouped.values())
    with torch.no_grad():
        want = layer.base_layer(x)
        for i, role in enumerate("abc"):
            a, b = layer.lora_A[role].weight, layer.lora_B[role].weight
            want = want + (ids == i)[..., None] * (x @ a.T @ b.T) * layer.scaling[role]
    torch.testing.assert_close(out, want, rtol=0, atol=1e-5)


@pytest.mark.parametrize("tokens", [6, 40])
def test_gradients_reach_only_the_adapters_in_the_forward_as_if_alone(tiny_qwen3_path, tokens):
    model = routed_model(tiny_qwen3_path)
    ids = prompts(4, tokens)
    advantages = torch.tensor([1.0, -0.5, 0.25, 2.0])
    rows = torch.tensor([0, 1, 0, -1])  # "c" has no row

    def grads(route: torch.Tensor, keep: list[int]) -> dict[str, torch.Tensor | None]:
        # A policy-gradient loss as the trainer's: each row's next-token log-probs times its advantage.
        model.zero_grad(set_to_none=True)
        with routed(model, route):
            logp = torch.log_softmax(model(input_ids=ids[keep]).logits[:, :-1], -1)
            chosen = logp.gather(-1, ids[keep, 1:, None])[..., 0]
            (-(chosen * advantages[keep, None]).sum() / chosen.numel()).backward()
        return {n: None if p.grad is None else p.grad.clone() for n, p in model.named_parameters() if "lora_" in n}

    mixed = grads(rows, [0, 1, 2, 3])
    assert all(g is None for n, g in mixed.items() if ".c." in n)
    assert all(g is not None and float(g.abs().sum()) > 0 for n, g in mixed.items() if ".a." in n or ".b." in n)
    for role, keep in [("a", [0, 2]), ("b", [1])]:
        alone = grads(rows[keep], keep)
        scale = 4 / len(keep)  # the mixed loss averages over all four rows
        for name, g in mixed.items():
            if f".{role}." in name:
                torch.testing.assert_close(g * scale, alone[name], rtol=0, atol=1e-6)
            else:
                assert alone[name] is None, name


def test_forwards_outside_routed_and_bad_ids_raise(tiny_qwen3_path):
    model = routed_model(tiny_qwen3_path)
    with pytest.raises(RuntimeError, match=r"adapters per role \(a, b, c\) runs its forwards inside"):
        model(input_ids=prompts(1, 3))
    with pytest.raises(ValueError, match=r"outside -1 \.\. 2"), routed(model, torch.tensor([3])):
        pass
    with pytest.raises(ValueError, match="an integer tensor"), routed(model, torch.tensor([0.0])):
        pass
    with pytest.raises(ValueError, match="do not route"), routed(model, torch.zeros(2, 3, dtype=torch.long)):
        model(input_ids=prompts(2, 4))
    with routed(model, torch.tensor([0])), pytest.raises(RuntimeError, match="already in progress"), \
            routed(model, torch.tensor([1])):
        pass
    with pytest.raises(RuntimeError, match="runs its forwards inside"):  # the context is gone again
        model(input_ids=prompts(1, 3))


def test_kept_stacked_weights_follow_a_weight_written_in_place(tiny_qwen3_path):
    model = routed_model(tiny_qwen3_path)
    ids, rows = prompts(2, 1), torch.tensor([0, 1])
    layer = model.model.layers[0].self_attn.v_proj  # (one token: q and k change nothing)
    with torch.no_grad(), routed(model, rows):
        model(input_ids=ids)
    assert layer.__dict__[routing._STACK] is None  # kept only when asked (an engine)
    with torch.no_grad(), routed(model, rows, keep_stacked=True):
        model(input_ids=ids)
    assert layer.__dict__[routing._STACK] is not None  # the decode-sized forward kept them
    with torch.no_grad():
        layer.lora_B["b"].weight.add_(0.5)  # as a weight sync writes an adapter tensor
    with torch.no_grad(), routed(model, rows, keep_stacked=True):
        out = model(input_ids=ids).logits
    with torch.no_grad():
        ref = merged_model(tiny_qwen3_path, model, "b")(input_ids=ids[1:]).logits
    torch.testing.assert_close(out[1:], ref, rtol=0, atol=1e-5)


def test_adapters_added_and_removed_at_run_time(tiny_qwen3_path):
    """A service's clients come and go: an adapter added beside routed ones and one removed leave the
    others' routes, values and requires_grad as they were, and peft's own adapter sum stays off."""
    model = routed_model(tiny_qwen3_path)
    ids = prompts(3, 10)
    with torch.no_grad(), routed(model, torch.tensor([0, 1, -1])):
        before = model(input_ids=ids).logits
    grads = {n: p.requires_grad for n, p in model.named_parameters()}
    add_adapter(model, "d", AdapterConfig(r=3, alpha=6, target_modules=["q_proj"]))
    assert adapter_names(model) == ["a", "b", "c", "d"]
    assert all(p.requires_grad == (grads[n] if n in grads else adapter_of(n) == "d")
               for n, p in model.named_parameters())
    gen = torch.Generator().manual_seed(5)
    with torch.no_grad():  # "d" drawn (peft starts B at zero, which would hide a wrong route)
        for n, p in model.named_parameters():
            if adapter_of(n) == "d":
                p.copy_(torch.randn(p.shape, generator=gen) * 0.05)
    with torch.no_grad(), routed(model, torch.tensor([0, 1, -1])):
        torch.testing.assert_close(model(input_ids=ids).logits, before, rtol=0, atol=0)
    with torch.no_grad(), routed(model, torch.full((1,), 3)):
        alone = model(input_ids=ids[:1]).logits
        torch.testing.assert_close(alone, merged_model(tiny_qwen3_path, model, "d")(input_ids=ids[:1]).logits,
                                   rtol=0, atol=1e-5)
    with pytest.raises(ValueError, match="has an adapter of that name"):
        add_adapter(model, "d", AdapterConfig(r=3))
    remove_adapter(model, "a")
    assert adapter_names(model) == ["b", "c", "d"]
    assert all(adapter_of(n) != "a" for n, _ in model.named_parameters())
    assert all(p.requires_grad == (adapter_of(n) in ("b", "d")) for n, p in model.named_parameters())
    with torch.no_grad(), routed(model, torch.tensor([0, -1])):
        torch.testing.assert_close(model(input_ids=ids[1:]).logits, before[1:], rtol=0, atol=1e-6)


def test_an_adapter_added_on_modules_no_other_adapts_is_routed_there(tiny_qwen3_path):
    """A service's client may adapt other modules than the adapters already there: its new LoRA layers
    route too (a layer left unrouted would run the base weights alone, silently)."""
    model = apply_adapters(load_model(tiny_qwen3_path), {"a": ROLES["a"]})  # q_proj and v_proj only
    add_adapter(model, "d", AdapterConfig(r=3, alpha=6, target_modules=["down_proj"]))
    draw_adapters(model, seed=2)
    ids = prompts(1, 6)
    with torch.no_grad(), routed(model, torch.full((1,), 1)):
        alone = model(input_ids=ids).logits
        torch.testing.assert_close(alone, merged_model(tiny_qwen3_path, model, "d")(input_ids=ids).logits,
                                   rtol=0, atol=1e-5)
    with pytest.raises(RuntimeError, match="inside toolrl.modeling.adapter_routing.routed"):
        model(input_ids=ids)


def test_one_adapters_tensors_move_to_another_under_names_without_its_own(tiny_qwen3_path):
    """The adapter API a service uses: a name from any string, a seeded initialisation that leaves the
    process's random state alone, one adapter's parameters, and its tensors copied into another."""
    name = adapter_name("m", "client-7/run:1")
    assert re.fullmatch(r"m_[0-9a-f]{16}", name) and name == adapter_name("m", "client-7/run:1")
    assert name != adapter_name("m", "client-7/run:2")
    with pytest.raises(ValueError, match="prefix '1.x'"):
        adapter_name("1.x", "key")
    config = AdapterConfig(r=2, alpha=4, target_modules=["q_proj", "v_proj"])
    model, other = load_model(tiny_qwen3_path), load_model(tiny_qwen3_path)
    rng = torch.random.get_rng_state()
    add_adapter(model, name, config, seed=3)
    add_adapter(other, "x", config, seed=3)
    assert torch.equal(torch.random.get_rng_state(), rng)
    add_adapter(model, "copy", config, seed=4)
    own = adapter_parameters(model, name)
    assert list(own) == [n.replace(f".{name}.", ".") for n, _ in model.named_parameters() if adapter_of(n) == name]
    assert len(own) == 2 * 2 * 2 and all(k.endswith((".lora_A.weight", ".lora_B.weight")) for k in own)
    initial = adapter_state(model, name)
    assert all(torch.equal(t, initial[k]) for k, t in adapter_state(other, "x").items())  # the same seed
    assert not all(torch.equal(t, initial[k]) for k, t in adapter_state(model, "copy").items())
    with torch.no_grad():
        for p in own.values():
            p.add_(0.1)
    state = adapter_state(model, name)
    assert all(t.data_ptr() != own[k].data_ptr() and torch.equal(t, own[k]) for k, t in state.items())
    load_adapter_state(model, "copy", state)
    assert all(torch.equal(p, state[k]) for k, p in adapter_parameters(model, "copy").items())
    add_adapter(model, "wider", AdapterConfig(r=3, alpha=4, target_modules=["q_proj", "v_proj"]))
    for bad in ({k: t for k, t in list(state.items())[1:]}, state):  # a tensor missing; another rank
        with pytest.raises(ValueError, match="do not fit adapter"):
            load_adapter_state(model, "wider" if bad is state else "copy", bad)
    with pytest.raises(ValueError, match="no adapter 'nope'"):
        adapter_parameters(model, "nope")
