"""Tree rollouts (``rollout.tree``) against flat GRPO rollouts: generated tokens and wall time per trained
trajectory, on the same task and the same number of trained trajectories, side by side.

The task: the tiny random Qwen3 (``toolrl.model_sources.tiny_qwen3``, fp32, CPU) through the built-in
transformers engine and toolrl's own loop, a simulated user (an environment session) who asks the model
to go on twice, so each trajectory is three model turns. The random model's end-of-turn logit is raised
by 10 (an lm_head bias), so its turns end (about five tokens each) instead of running to
``max_new_tokens``. ``--prompts`` distinct prompts, ``rollout.n`` = 8 trajectories trained per prompt:

- flat: 8 trajectories per prompt, each generated whole (the group's prompt prefilled once, as usual);
- tree: ``rollout.tree`` at its defaults (width 2, depth 2, splits before turns 1 and 2): 2 trees of 4
  leaves per prompt, the first turn generated once per tree, the second once per pair of leaves.

Both run at temperature 1 with the same rollout seed; ``gen tokens/traj`` is the engine's generated
tokens (``EngineStats.generated_tokens``) over the trajectories trained, ``prefilled/traj`` its
prefilled prompt tokens likewise, ``s/traj`` the median wall time of ``--repeats`` rollouts over the
trajectories. The last line reads ``tree/flat generated tokens per trajectory: X.XX``.

    OMP_NUM_THREADS=1 python benchmarks/tree_rollouts.py [--prompts 4] [--repeats 3]
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import time
from typing import Any

from _common import machine, single_thread, table

single_thread()

import torch  # noqa: E402
from toolrl import model_sources  # noqa: E402
from toolrl.config import RewardConfig, RolloutConfig, TreeConfig  # noqa: E402
from toolrl.engines import ModelSource  # noqa: E402
from toolrl.engines.transformers import TransformersEngine  # noqa: E402
from toolrl.parsers.hermes import HermesParser  # noqa: E402
from toolrl.renderers.chat import ChatRenderer  # noqa: E402
from toolrl.rollout import RolloutContext, Route, run_rollouts  # noqa: E402
from toolrl.schemas import Sample  # noqa: E402
from toolrl.sessions import EnvironmentSession, Reset, SessionKind  # noqa: E402

single_thread()

N = 8
END_BIAS = 10.0


class User(EnvironmentSession):
    """Asks the model to go on twice, then takes its answer; clones by copying what it heard."""

    async def reset(self, sample: Sample) -> Reset:
        self.heard: list[str] = []
        return Reset()

    async def respond(self, message: str) -> str | None:
        self.heard.append(message)
        return f"Go on ({len(self.heard)})." if len(self.heard) < 3 else None

    async def clone(self) -> User:
        twin = User(self.options, self.context)
        twin.heard = list(self.heard)
        return twin


def tiny_model(tokenizer: Any) -> Any:
    model = model_sources.load_model(model_sources.tiny_qwen3())
    bias = torch.zeros(model.config.vocab_size)
    bias[tokenizer.convert_tokens_to_ids("<|im_end|>")] = END_BIAS
    model.lm_head.register_forward_hook(lambda module, args, out: out + bias)
    return model


async def rollout(model: Any, tokenizer: Any, samples: list[Sample], tree: TreeConfig | None) -> dict[str, float]:
    engine = TransformersEngine.create(ModelSource(path=model_sources.tiny_qwen3(), module=model,
                                                   tokenizer=tokenizer), {"device": "cpu"})
    config = RolloutConfig(n=N, max_new_tokens=32, max_response_tokens=1024, tree=tree)
    ctx = RolloutContext(engine=engine, renderer_factory=lambda s: ChatRenderer(tokenizer, s), config=config,
                         routes={None: Route({}, 8, HermesParser(), [], RewardConfig(),
                                             SessionKind("user", User, User.Options(), "."))})
    t0 = time.perf_counter()
    trajs = await run_rollouts(ctx, samples, N, seed=11)
    seconds = time.perf_counter() - t0
    await engine.close()
    return {"trajectories": len(trajs), "generated": engine.stats.generated_tokens,
            "prefilled": engine.stats.prefilled_tokens, "seconds": seconds,
            "turns": statistics.mean(t.turns for t in trajs)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--prompts", type=int, default=4)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    tokenizer = model_sources.qwen_tokenizer("qwen2_5")  # its template is append-only for user turns
    model = tiny_model(tokenizer)
    samples = [Sample(prompt=[{"role": "user", "content": f"Tell me about the number {7 * i + 3}."}], index=i)
               for i in range(args.prompts)]
    print(machine())
    runs: dict[str, list[dict[str, float]]] = {"flat": [], "tree": []}
    for _ in range(args.repeats):  # alternated, so drift on a shared machine hits both
        for name, tree in (("flat", None), ("tree", TreeConfig())):
            runs[name].append(asyncio.run(rollout(model, tokenizer, samples, tree)))
    rows, per = [], {}
    for name, results in runs.items():
        first = results[0]
        trajs = first["trajectories"]
        per[name] = first["generated"] / trajs
        rows.append([name, trajs, first["turns"], per[name], first["prefilled"] / trajs,
                     statistics.median(r["seconds"] for r in results) / trajs])
    print(f"{args.prompts} prompts x rollout.n={N}; tree: width 2, depth 2, splits before turns 1 and 2; "
          f"median of {args.repeats} rollouts")
    print(table(["rollout", "trajectories", "turns", "gen tokens/traj", "prefilled/traj", "s/traj"], rows))
    seconds = {name: statistics.median(r["seconds"] for r in results) for name, results in runs.items()}
    print(f"tree/flat wall time per trajectory: {seconds['tree'] / seconds['flat']:.2f}")
    print(f"tree/flat generated tokens per trajectory: {per['tree'] / per['flat']:.2f}")


if __name__ == "__main__":
    main()
