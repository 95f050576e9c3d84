"""The ``python-math`` environment: disjoint generated splits whose answers are right (checked
against brute force), and a route whose code_interpreter computes them in the embedded sandbox,
scored by the ``math`` reward."""

from __future__ import annotations

import math
import random

from toolrl.config import load_config
from toolrl.data.sources import load_samples, load_split
from toolrl.rollout.routes import build_routes
from toolrl.testing.environments import listed_environments
from toolrl_sandbox_fusion.environment import PYTHON_MATH, divisible_count, held_out

# What a model would write for each family; run in the sandbox, it must print the ground truth.
SOLUTIONS = {
    "prime_sum": "n={n}\ns=bytearray([1])*n; s[:2]=b'\\0\\0'\nfor p in range(2,int(n**.5)+1):\n"
                 "    if s[p]: s[p*p::p]=bytearray(len(range(p*p,n,p)))\nprint(sum(i for i in range(n) if s[i]))",
    "power_mod": "print(pow({a},{b},{m}))",
}


def split(options: dict, name: str) -> list:
    env, validated = PYTHON_MATH.resolve(options)
    return load_split(env, name, validated)


def test_splits_are_disjoint_distinct_and_cover_the_families() -> None:
    train, test = split({"train_size": 200, "test_size": 40}, "train"), split({"train_size": 200, "test_size": 40}, "test")
    train_q, test_q = [s.prompt[0].content for s in train], [s.prompt[0].content for s in test]
    assert len(train) == 200 and len(test) == 40 and set(train_q).isdisjoint(test_q)
    assert len(set(train_q)) == 200 and all(held_out(q) for q in test_q) and not any(held_out(q) for q in train_q)
    assert {s.data_source.rsplit("/", 1)[1] for s in train} == {"prime_sum", "power_mod", "factorial_digits",
                                                                  "divisible_count"}
    assert [s.prompt for s in split({}, "test")] == [s.prompt for s in split({}, "test")]  # reproducible


def test_answers_match_brute_force() -> None:
    rng = random.Random(0)
    for _ in range(200):
        n, (a, b, c) = rng.randint(1, 3000), rng.sample(range(3, 30), 3)
        assert divisible_count(n, a, b, c) == sum(1 for k in range(1, n + 1) if (k % a == 0 or k % b == 0) and k % c)
    for s in split({"families": ["factorial_digits"], "train_size": 20}, "train"):
        n = int(s.prompt[0].content.split(" digits of ")[1].split("!")[0])
        assert int(s.ground_truth) == sum(map(int, str(math.factorial(n))))


async def test_the_route_computes_answers_in_the_sandbox() -> None:
    config = load_config(None, data={"env": "python-math", "env_options": {
        "families": ["prime_sum", "power_mod"], "test_size": 4, "timeout": 20}})
    samples = load_samples(config, "test")
    assert samples[0].prompt[-1].content.endswith("then give the final answer as \\boxed{N}.")
    routes, tools = await build_routes(config, samples)
    try:
        route = routes["python-math"]
        assert route.max_turns == 4 and route.parser.name == "hermes"
        [(name, weight, reward)] = route.reward_functions
        interpreter = route.tools["code_interpreter"]
        for sample in samples:
            words = sample.prompt[-1].content.replace("?", " ").split()
            if sample.data_source.endswith("prime_sum"):
                code = SOLUTIONS["prime_sum"].format(n=words[words.index("below") + 1])
            else:  # "What is A^B modulo M"
                a, b = words[2].split("^")
                code = SOLUTIONS["power_mod"].format(a=a, b=b, m=words[4])
            iid = await interpreter.create()
            try:
                result = await interpreter.call(iid, {"code": code})
            finally:
                await interpreter.release(iid)
            assert result.status == "ok" and result.response.text == sample.ground_truth
            assert (name, weight) == ("math", 1.0)
            assert reward(f"The answer is \\boxed{{{result.response.text}}}.", sample.ground_truth) == 1.0
            assert reward("\\boxed{1}", sample.ground_truth) == 0.0
    finally:
        for tool in tools:
            await tool.close()


def test_listed_by_this_plugin_and_absent_without_it() -> None:
    [row] = [r for r in listed_environments() if r["name"] == "python-math"]
    assert row["plugin"] == "sandbox-fusion" and row["tools"] == ["code_interpreter"] and row["rewards"] == {"math": 1.0}
    assert row["splits"]["test"] == {"source": "generated", "size": 64}
    assert "python-math" not in {r["name"] for r in listed_environments(TOOLRL_DISABLE_PLUGINS="sandbox-fusion")}
