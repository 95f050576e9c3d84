"""The models behind the service: a base model per name the server holds, each training client's LoRA
adapter on it with its own AdamW, and the sampler's copies of saved adapters.

A base is loaded twice: the trainer's copy, where every training client's adapter is injected
(``toolrl.modeling.adapters.add_adapter``) and each request's tokens are routed through the client's alone
(:mod:`toolrl.modeling.adapter_routing`: other clients' weights and gradients are not touched), and the
``transformers`` rollout engine (built by name, as the core builds it) over a second copy, where each weight set saved
for a sampler is an adapter of its own (frozen, a copy of the trainer's at that point) and an adapter
``base`` of zeros stands for the base model: the engine batches rows of every client's adapters.
"""

from __future__ import annotations

import hashlib
import threading
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from toolrl_tinker.batch import SUM, Datum, UserError, algorithm, check, packed

# LoRA's scale numerator: the update is ALPHA / rank * B @ A.
ALPHA = 32.0
BASE_ADAPTER = "base"
ATTN = ["q_proj", "k_proj", "v_proj", "o_proj"]
MLP = ["gate_proj", "up_proj", "down_proj"]

# Names the server answers to for toolrl's built-in models (toolrl.model_sources.resolve_source).
ALIASES = {"HuggingFaceTB/SmolLM2-135M-Instruct": "smollm2-135m-instruct"}


def target_modules(train_attn: bool, train_mlp: bool) -> list[str]:
    targets = (ATTN if train_attn else []) + (MLP if train_mlp else [])
    if not targets:
        raise UserError("lora_config: train_attn and train_mlp are both false: nothing would train")
    return targets


class Base:
    """One base model: the trainer's copy, its lock (one routed forward at a time) and the sampler."""

    def __init__(self, name: str, max_sampler_rows: int = 32) -> None:
        import torch
        from toolrl.config import AdapterConfig, ModelConfig
        from toolrl.engines import ModelSource
        from toolrl.model_sources import load_model, load_tokenizer, resolve_source
        from toolrl.modeling.adapters import add_adapter
        from toolrl.plugins.parts import BuildContext, build_part

        self.name = name
        self.path = resolve_source(ModelConfig(source=ALIASES.get(name, name)))
        self.model = load_model(self.path, dtype="float32", device="cpu")
        self.model.config.use_cache = False
        self.tokenizer = load_tokenizer(self.path)
        self.vocab = int(self.model.get_output_embeddings().weight.shape[0])
        self.context = int(getattr(self.model.config, "max_position_embeddings", 0) or 1 << 20)
        self.lock = threading.Lock()
        sampler = load_model(self.path, dtype="float32", device="cpu")
        zero = AdapterConfig(r=1, alpha=1.0, target_modules=ATTN + MLP, frozen=True)
        add_adapter(sampler, BASE_ADAPTER, zero)
        with torch.no_grad():
            for n, p in sampler.named_parameters():
                if f".{BASE_ADAPTER}." in n:
                    p.zero_()
        source = ModelSource(self.path, module=sampler.eval(), tokenizer=self.tokenizer)
        # Packed linears: several clients' rows decode together (a second copy of the sampler's weights).
        options = {"device": "cpu", "max_batch_size": max_sampler_rows, "packed_linears": True}
        self.engine = build_part("rollout_engines", "transformers", options,
                                 BuildContext("tinker-service sampler", inputs={"source": source}))


@dataclass
class Run:
    """A training client's model: its adapter on the base and its optimizer."""

    model_id: str
    owner: str
    base: Base
    rank: int
    targets: list[str]
    seed: int | None
    optimizer: Any = None
    steps: int = 0
    samplers: list[str] = field(default_factory=list)

    @property
    def adapter(self) -> str:
        """The adapter's name on the base: the model id made a torch module name."""
        return "m_" + hashlib.sha1(self.model_id.encode()).hexdigest()[:16]

    def params(self) -> list[Any]:
        from toolrl.modeling.adapters import adapter_of

        return [p for n, p in self.base.model.named_parameters() if adapter_of(n) == self.adapter]

    def adapter_state(self) -> dict[str, Any]:
        """The adapter's tensors under names without the adapter's (another run's names load them)."""
        from toolrl.modeling.adapters import adapter_of

        tag = f".{self.adapter}."
        return {n.replace(tag, "."): p.detach().clone() for n, p in self.base.model.named_parameters()
                if adapter_of(n) == self.adapter}

    def load_adapter_state(self, state: dict[str, Any]) -> None:
        import torch
        from toolrl.modeling.adapters import adapter_of

        tag = f".{self.adapter}."
        mine = {n.replace(tag, "."): p for n, p in self.base.model.named_parameters() if adapter_of(n) == self.adapter}
        if set(mine) != set(state):
            raise UserError("the checkpoint's adapter does not fit this model (another base, rank or target modules)")
        with torch.no_grad():
            for n, p in mine.items():
                p.copy_(state[n])


def create_adapter(run: Run) -> None:
    """The run's adapter on its base (peft's init: A random from ``seed``, B zero) and its optimizer."""
    import torch
    from toolrl.config import AdapterConfig
    from toolrl.modeling.adapters import add_adapter

    with run.base.lock, torch.random.fork_rng(devices=[]):
        torch.manual_seed(0 if run.seed is None else run.seed)
        add_adapter(run.base.model, run.adapter, AdapterConfig(r=run.rank, alpha=ALPHA, target_modules=run.targets))
    run.optimizer = torch.optim.AdamW(run.params(), lr=1e-4)


def micro_batches(data: Sequence[Datum], max_tokens: int) -> list[tuple[int, int]]:
    """Consecutive datum ranges ``[start, end)`` of at most ``max_tokens`` tokens each (a longer datum
    makes one alone): the pieces one request runs as, so its working set is one piece's, not the batch's."""
    spans, start, held = [], 0, 0
    for i, d in enumerate(data):
        if i > start and held + len(d.tokens) > max_tokens:
            spans.append((start, i))
            start, held = i, 0
        held += len(d.tokens)
    spans.append((start, len(data)))
    return spans


def forward_backward(run: Run, data: Sequence[Datum], loss_fn: str | None, config: dict[str, float] | None,
                     forward_only: bool, max_tokens: int, micro_tokens: int) -> tuple[list[Any], float]:
    """The datums' target log-probs (one array each) and the loss, its gradient added to the adapter's
    ``.grad`` unless ``forward_only`` (``loss_fn`` None: a forward, no loss). The datums run in
    :func:`micro_batches` of ``micro_tokens``: the loss is a sum over tokens, so the pieces' losses and
    gradients add up to the whole batch's."""
    import torch
    from toolrl.modeling.adapter_routing import adapter_names
    from toolrl.training.packing import through_adapters
    from toolrl.training.step import policy_loss, response_logprobs

    base = run.base
    algo, loss_part = algorithm(loss_fn or "cross_entropy", config if loss_fn is not None else None)
    check(data, loss_fn, base.vocab, max_tokens)
    lps: list[Any] = []
    total = 0.0
    with base.lock:
        adapter = adapter_names(base.model).index(run.adapter)
        for start, end in micro_batches(data, micro_tokens):
            batch = packed(data[start:end], adapter, loss_fn)
            with torch.set_grad_enabled(not forward_only), through_adapters(base.model, batch):
                new_lp = response_logprobs(base.model, batch)
                prox = new_lp.detach() if loss_fn in (None, "cross_entropy") else batch.engine_logprobs
                loss, _ = policy_loss(new_lp, prox, batch, algo, SUM, loss_fn=loss_part)
                if not forward_only:
                    loss.backward()
            total += float(loss.detach())
            grid = new_lp.detach()
            lps.extend(grid[i, :len(d.tokens)].numpy().copy() for i, d in enumerate(data[start:end]))
    return lps, total


def optim_step(run: Run, lr: float, beta1: float, beta2: float, eps: float, weight_decay: float,
               grad_clip_norm: float) -> dict[str, float]:
    """One AdamW step of the run's adapter with the request's parameters (a clip first when
    ``grad_clip_norm`` > 0), the gradients then cleared."""
    import torch

    with run.base.lock:
        group = run.optimizer.param_groups[0]
        group.update(lr=lr, betas=(beta1, beta2), eps=eps, weight_decay=weight_decay)
        metrics: dict[str, float] = {}
        params = run.params()
        if grad_clip_norm > 0:
            metrics["grad_norm:mean"] = float(torch.nn.utils.clip_grad_norm_(params, grad_clip_norm))
        run.optimizer.step()
        run.optimizer.zero_grad(set_to_none=True)
        run.steps += 1
    return metrics


def copy_to_sampler(base: Base, rank: int, targets: list[str], name: str, state: dict[str, Any]) -> None:
    """An adapter's tensors (``state``, as :meth:`Run.adapter_state` gives them) as sampler adapter
    ``name``, frozen; a no-op when the sampler holds ``name`` already."""
    import torch
    from toolrl.config import AdapterConfig
    from toolrl.modeling.adapter_routing import adapter_names
    from toolrl.modeling.adapters import add_adapter

    tag = f".{name}."

    def inject(model: Any) -> None:
        if name in adapter_names(model):
            return
        add_adapter(model, name, AdapterConfig(r=rank, alpha=ALPHA, target_modules=targets, frozen=True))
        with torch.no_grad():
            for n, p in model.named_parameters():
                if tag in n:
                    p.copy_(state[n.replace(tag, ".")])

    base.engine.apply_adapters(inject)


def drop_sampler(base: Base, name: str) -> None:
    from toolrl.modeling.adapters import remove_adapter

    base.engine.apply_adapters(lambda model: remove_adapter(model, name))


def release(run: Run) -> None:
    """The run's adapter off the trainer's copy (its optimizer with it)."""
    from toolrl.modeling.adapters import remove_adapter

    with run.base.lock:
        remove_adapter(run.base.model, run.adapter)
        run.optimizer = None
