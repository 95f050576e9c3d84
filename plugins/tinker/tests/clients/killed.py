"""A client the test kills (SIGKILL) while its requests are in the server's queue: it trains a step,
saves its state, and once the test says so (a line on stdin) sends a forward_backward and a sample
without waiting for them, and sleeps; each step printed for the test."""

import sys
import time

import numpy as np
import tinker
from tinker import types

service = tinker.ServiceClient(base_url=sys.argv[1])
tc = service.create_lora_training_client(base_model="tiny-qwen3", rank=2, seed=5).result()
ids = list(range(20, 60))
datum = types.Datum(model_input=types.ModelInput.from_ints(ids[:-1]),
                    loss_fn_inputs={"target_tokens": np.array(ids[1:]), "weights": np.ones(len(ids) - 1, np.float32)})
tc.forward_backward([datum], "cross_entropy").result()
tc.optim_step(types.AdamParams(learning_rate=1e-2)).result()
print("saved", tc.save_state("before-kill").result().path, flush=True)
print("model", tc.model_id, flush=True)
sys.stdin.readline()
pending = [tc.forward_backward([datum] * 4, "cross_entropy"),
           service.create_sampling_client(base_model="tiny-qwen3").sample(
               types.ModelInput.from_ints(ids[:5]), 2, types.SamplingParams(max_tokens=8))]
print("sent", flush=True)
time.sleep(600)
