"""A reward that varies between the trajectories of a random model (whose geo3k reward is always 0),
so that a GRPO group has advantages to train on: 1.0 when the model's first token id is even."""

from toolrl import hookimpl


class ParityReward:
    name = "parity"

    def __call__(self, response, ground_truth, **info):
        tokens = info["response_ids"]
        return float(bool(tokens) and tokens[0] % 2 == 0)


@hookimpl
def register_reward_functions(register):
    register(ParityReward, name="parity")
