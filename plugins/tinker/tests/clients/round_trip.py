"""A client script run under another SDK release (the test's TOOLRL_TINKER_OLD_SDK_PYTHON): the round
trip through the server, every value printed for the test to check. Written for the older SDK's API
(clients returned directly, not as futures)."""

import sys

import numpy as np
import tinker
from tinker import types

url = sys.argv[1]
service = tinker.ServiceClient(base_url=url)
tc = service.create_lora_training_client(base_model="tiny-qwen3", rank=4)
ids = list(range(10, 30))
ce = types.Datum(model_input=types.ModelInput.from_ints(ids[:-1]),
                 loss_fn_inputs={"target_tokens": np.array(ids[1:]), "weights": np.ones(19, np.float32)})
print("sdk", tinker.__version__)
print("cross_entropy", tc.forward_backward([ce], "cross_entropy").result().metrics["loss:sum"])
rl = types.Datum(model_input=types.ModelInput.from_ints(ids[:-1]),
                 loss_fn_inputs={"target_tokens": np.array(ids[1:]), "logprobs": np.full(19, -12, np.float32),
                                 "advantages": np.ones(19, np.float32)})
print("ppo", tc.forward_backward([rl], "ppo").result().metrics["loss:sum"])
tc.optim_step(types.AdamParams(learning_rate=1e-3)).result()
sampler = tc.save_weights_and_get_sampling_client()
res = sampler.sample(types.ModelInput.from_ints(ids[:5]), 2, types.SamplingParams(max_tokens=4, seed=1)).result()
print("samples", [len(s.tokens) for s in res.sequences])
print("logprobs", sampler.compute_logprobs(types.ModelInput.from_ints(ids[:5])).result()[1:])
path = tc.save_state("older").result().path
print("loaded", service.create_training_client_from_state(path).model_id)
