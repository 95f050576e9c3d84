"""``toolrl serve``'s prompt scoring (vLLM's ``prompt_logprobs`` on ``/v1/completions``): each prompt
token's log-prob under the served model, in vLLM's shape, against a separate forward of the same
weights; an engine that cannot score is refused by name."""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from typing import Any

import pytest
import torch
from support import ServeProcess

PROMPTS = [[785, 3974, 13876, 38835, 34208, 916, 279, 15678, 5562, 13], [9707, 11, 1879, 0, 3555]]


def post(server: ServeProcess, body: dict[str, Any]) -> tuple[int, dict[str, Any]]:
    req = urllib.request.Request(f"{server.url}/completions", json.dumps(body).encode(),
                                 {"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=60) as resp:
            return resp.status, json.loads(resp.read())
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read())


def test_prompt_logprobs_are_a_separate_forward_of_the_served_model(tiny_server, tiny_path):
    from toolrl.model_sources import load_model

    status, body = post(tiny_server, {"model": "tiny-qwen3", "prompt": PROMPTS, "max_tokens": 1,
                                      "temperature": 0.0, "prompt_logprobs": 2})
    assert status == 200, body
    model = load_model(tiny_path).eval()
    assert [c["index"] for c in body["choices"]] == [0, 1]
    for prompt, choice in zip(PROMPTS, body["choices"]):
        scored = choice["prompt_logprobs"]
        assert len(scored) == len(prompt) and scored[0] is None  # vLLM's shape: nothing for the first token
        with torch.no_grad():
            lp = torch.log_softmax(model(input_ids=torch.tensor([prompt])).logits[0, :-1].float(), -1)
        for j, token in enumerate(prompt[1:]):
            row = scored[j + 1]
            assert str(token) in row and 2 <= len(row) <= 3  # the prompt's token and the 2 most likely
            got = row[str(token)]
            assert abs(got["logprob"] - lp[j, token].item()) < 1e-5
            assert got["rank"] == int((lp[j] > lp[j, token]).sum()) + 1
            best = lp[j].topk(2)
            for r, (t, v) in enumerate(zip(best.indices.tolist(), best.values.tolist())):
                assert abs(row[str(t)]["logprob"] - v) < 1e-5 and row[str(t)]["rank"] == r + 1


def test_an_engine_that_cannot_score_refuses_prompt_logprobs_by_name(scripted_server):
    status, body = post(scripted_server, {"model": "tiny-qwen3", "prompt": PROMPTS[0], "max_tokens": 1,
                                          "prompt_logprobs": 0})
    assert status == 400
    assert body["error"]["param"] == "prompt_logprobs"
    assert "chat_script engine does not score given tokens" in body["error"]["message"]


@pytest.mark.parametrize("body", [{"echo": True, "logprobs": 1}, {"prompt_logprobs": 0, "stream": True}])
def test_echo_and_streamed_prompt_logprobs_are_refused(tiny_server, body):
    status, answer = post(tiny_server, {"model": "tiny-qwen3", "prompt": PROMPTS[1], "max_tokens": 1, **body})
    assert status == 400 and answer["error"]["param"] in ("echo", "prompt_logprobs")
