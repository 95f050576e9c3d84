"""``calc_geo3k_reward``: the model checks its answer against the sample's ground truth mid-rollout.

The ground truth arrives per trajectory through ``create_kwargs`` (the dataset's
``extra_info.tools_kwargs.calc_geo3k_reward.create_kwargs.ground_truth``) and is kept in that
trajectory's state. Each call grades the answer; the step reward is 0.0 when the score beats the best
so far and a penalty (-0.05) otherwise, so guessing repeatedly costs reward; ``calc_reward`` is the
best score.
"""

from __future__ import annotations

from typing import Any, ClassVar

from pydantic import BaseModel, ConfigDict
from toolrl.schemas import ToolResponse
from toolrl.tools import Tool

from toolrl_geo3k.grading import MAX_ANSWER_CHARS, is_equivalent


class Geo3kToolConfig(BaseModel):
    model_config = ConfigDict(extra="forbid")

    no_improvement_penalty: float = -0.05


class Geo3kTool(Tool):
    schema: ClassVar[dict[str, Any]] = {
        "type": "function",
        "function": {
            "name": "calc_geo3k_reward",
            "description": (
                "Check your answer to the geometry problem: returns reward=1.0 if it is correct and 0.0 "
                "otherwise. Calling again without improving the answer is penalised."
            ),
            "parameters": {
                "type": "object",
                "properties": {
                    "answer": {
                        "type": "string",
                        "description": "The final answer: a number or expression, e.g. '3', '2\\sqrt{3}' or '\\frac{40}{3}'.",
                        "maxLength": MAX_ANSWER_CHARS,
                    }
                },
                "required": ["answer"],
                "additionalProperties": False,
            },
        },
    }
    config_model = Geo3kToolConfig

    async def create(
        self, instance_id: str | None = None, ground_truth: Any = None, **create_kwargs: Any
    ) -> str:
        if ground_truth is None:
            raise ValueError(
                f"tool '{self.name}' needs create_kwargs.ground_truth (in a dataset: "
                f"extra_info.tools_kwargs.{self.name}.create_kwargs.ground_truth)"
            )
        instance_id = await super().create(instance_id, **create_kwargs)
        self.state(instance_id).update(ground_truth=str(ground_truth), best=0.0)
        return instance_id

    async def execute(
        self, instance_id: str, arguments: dict[str, Any], **execute_kwargs: Any
    ) -> tuple[ToolResponse, float, dict[str, Any]]:
        state = self.state(instance_id)
        answer = arguments["answer"]
        score = 1.0 if is_equivalent(answer, state["ground_truth"]) else 0.0
        improved = score > state["best"]
        state["best"] = max(state["best"], score)
        step_reward = 0.0 if improved else self.config.no_improvement_penalty
        return ToolResponse(text=f"Current parsed {answer=} reward={score}"), step_reward, {"score": score}

    async def calc_reward(self, instance_id: str, **calc_reward_kwargs: Any) -> float:
        return self.state(instance_id)["best"]
