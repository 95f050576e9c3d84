"""Tick's curriculum, written against the public API only (``toolrl.curricula``), as an outside author
would: the training split read from its end, ``skip`` prompts passed over, every trajectory it is shown
counted (a count a checkpoint keeps)."""

from pydantic import BaseModel, ConfigDict, Field
from toolrl.curricula import Curriculum, GroupOutcome, TrainingSet


class TickBackwards(Curriculum):
    name = "tick_backwards"

    class Options(BaseModel):
        model_config = ConfigDict(extra="forbid", frozen=True)
        skip: int = Field(0, ge=0, description="the last prompts never drawn")

    def __init__(self, options: Options, data: TrainingSet) -> None:
        super().__init__(options, data)
        if options.skip >= len(data.samples):
            raise ValueError(f"skip: {options.skip} leaves none of the {len(data.samples)} prompts")
        self.seen = 0

    def choose(self, group: int) -> int:
        drawn = len(self.data.samples) - self.options.skip
        return drawn - 1 - group % drawn

    def observe(self, outcome: GroupOutcome) -> None:
        self.seen += len(outcome.rewards)

    def metrics(self) -> dict:
        return {"trajectories_seen": self.seen}

    def state_dict(self) -> dict:
        return {"seen": self.seen}

    def load_state_dict(self, state: dict) -> None:
        self.seen = int(state["seen"])
