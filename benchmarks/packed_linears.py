"""A model's linear layers once (a decode step's weight reads), per row count: ``F.linear`` on the dense
weights against the engine's packed layers (:mod:`toolrl.modeling.packed_linears`, ``packed_linears: true``:
oneDNN on weights packed once for 2+ rows; 1 row runs ``F.linear`` there too), CPU, one thread.

Every ``nn.Linear`` of the model (the LM head included) gets the same input rows in turn, without
gradients; a pass's time is the best of ``--repeats`` after one warm-up pass (which also packs), the two
arms alternating per row count. The outputs of the two arms are checked equal to float32 rounding.

Then what applying them costs a forward of the model (4 rows of one token, no KV), in this process's CPU
time (other processes' load does not count), the best of ``--repeats`` each: ``applied()`` entered and
left (each packed layer's forward set and unset), against what a ``TorchFunctionMode`` routing
``F.linear`` would cost before any of its work: the dense forward inside a mode whose handler only
passes each torch call on, less the dense forward.

    OMP_NUM_THREADS=1 python benchmarks/packed_linears.py [--model smollm2-135m-instruct] [--repeats 3]

The last line reads ``packed / dense pass time at 4 rows: X.XX``.
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable
from typing import Any

from _common import machine, single_thread, table

single_thread()

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402
from toolrl import model_sources  # noqa: E402
from toolrl.modeling.packed_linears import PackedLinears  # noqa: E402
from torch.overrides import TorchFunctionMode  # noqa: E402

single_thread()

ROWS = [1, 2, 3, 4, 8, 16, 32, 128]
MODELS = {"tiny-qwen3": model_sources.tiny_qwen3, "smollm2-135m-instruct": model_sources.smollm2_135m}


def best_pass(layers: list[Any], inputs: dict[int, torch.Tensor], call: Any, repeats: int) -> float:
    """Seconds of the fastest of ``repeats`` passes of ``call(layer, x)`` over every layer, after a warm-up."""
    best = float("inf")
    for r in range(repeats + 1):
        t0 = time.perf_counter()
        for layer in layers:
            call(layer, inputs[layer.in_features])
        if r:
            best = min(best, time.perf_counter() - t0)
    return best


def best_of(calls: list[Callable[[], Any]], repeats: int) -> list[float]:
    """CPU seconds of the fastest of ``repeats`` runs of each call, after a warm-up one; the calls alternate."""
    for call in calls:
        call()
    best = [float("inf")] * len(calls)
    for _ in range(repeats):
        for i, call in enumerate(calls):
            t0 = time.process_time()
            call()
            best[i] = min(best[i], time.process_time() - t0)
    return best


class PassThrough(TorchFunctionMode):
    """A mode that only passes each torch call on: the least any ``F.linear``-routing mode costs."""

    calls = 0

    def __torch_function__(self, func: Any, types: Any, args: tuple[Any, ...] = (), kwargs: Any = None) -> Any:
        PassThrough.calls += 1
        return func(*args, **(kwargs or {}))


def applying_costs(model: Any, packed: PackedLinears, repeats: int) -> list[str]:
    """The lines on what applying packed linears costs a forward (module docstring)."""
    ids = torch.randint(0, 1000, (4, 1), generator=torch.Generator().manual_seed(0))

    def forward() -> Any:
        return model(input_ids=ids, use_cache=False, logits_to_keep=1).logits

    def on_packed() -> Any:
        with packed.applied():
            return forward()

    def in_mode() -> Any:
        with PassThrough():
            return forward()

    def enter_and_leave() -> None:
        for _ in range(100):
            with packed.applied():
                pass

    with torch.no_grad():
        dense, packed_s, moded = best_of([forward, on_packed, in_mode], repeats)
        PassThrough.calls = 0
        in_mode()
        calls = PassThrough.calls
        applied = best_of([enter_and_leave], repeats)[0] / 100
    mode = moded - dense
    return [f"a 4-row forward: dense {1e3 * dense:.1f} ms, packed {1e3 * packed_s:.1f} ms",
            f"applied() entered and left: {1e3 * applied:.3f} ms ({len(packed.layers)} layers' forwards set and unset)",
            f"a pass-through TorchFunctionMode: +{1e3 * mode:.1f} ms a forward ({calls} torch calls through it)",
            f"applied() / a mode's pass-through, per forward: {applied / mode:.3f}"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", choices=sorted(MODELS), default="smollm2-135m-instruct")
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    model = model_sources.load_model(MODELS[args.model]()).requires_grad_(False)
    packed = PackedLinears(model)
    layers = [m for m in model.modules() if isinstance(m, torch.nn.Linear)]
    widths = {layer.in_features for layer in layers}
    rows, ms = [], {}
    with torch.no_grad():
        for n in ROWS:
            inputs = {w: torch.randn(n, w, generator=torch.Generator().manual_seed(n)) for w in widths}
            dense = best_pass(layers, inputs, lambda layer, x: F.linear(x, layer.weight, layer.bias), args.repeats)
            with packed.applied():
                on_packed = best_pass(layers, inputs, lambda layer, x: layer(x), args.repeats)
                for layer in layers[:8]:  # the same products, to float32 rounding
                    x = inputs[layer.in_features]
                    torch.testing.assert_close(layer(x), F.linear(x, layer.weight, layer.bias), rtol=1e-5, atol=1e-4)
            ms[n] = (1e3 * dense, 1e3 * on_packed)
            rows.append([n, f"{1e3 * dense:.1f}", f"{1e3 * on_packed:.1f}", f"{on_packed / dense:.2f}"])
    print(machine())
    print(f"{args.model}: {len(layers)} linear layers, one pass each, best of {args.repeats}")
    print(table(["rows", "F.linear ms", "packed ms", "packed / dense"], rows))
    print("\n".join(applying_costs(model, packed, args.repeats)))
    print(f"packed / dense pass time at 4 rows: {ms[4][1] / ms[4][0]:.2f}")


if __name__ == "__main__":
    main()
