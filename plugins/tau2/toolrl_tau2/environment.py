"""The τ²-bench environments ``tau2-airline``, ``tau2-retail``, ``tau2-telecom`` and ``tau2-mock``:
the domain's tasks (split as the package's ``split_tasks.json`` splits them) as samples, its policy as
the system prompt, and one ``tau2`` environment session per trajectory (:mod:`toolrl_tau2.session`:
the domain's tools, the simulated user, τ²'s evaluation as the reward term ``tau2``).

Options (``env_options``): ``user: {base_url, model}`` simulates the user with a model behind an
OpenAI-compatible endpoint; ``solo`` (mock, telecom: the package's solo policy; default: on for telecom
when no user is configured, off for every other domain) gives the agent the ticket and no user;
``judge: {base_url, model}`` judges τ²'s natural-language assertions (skipped, and recorded as
skipped, without one).
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field, create_model, model_validator
from toolrl.environments import Environment

from toolrl_tau2 import domain
from toolrl_tau2.session import Endpoint


class Tau2Options(BaseModel):
    model_config = ConfigDict(extra="forbid")

    domain: str = Field("", description="set by the environment")
    user: Endpoint | None = Field(None, description="the simulated user's OpenAI-compatible endpoint")
    judge: Endpoint | None = Field(None, description="the NL-assertion judge's OpenAI-compatible endpoint")
    solo: bool | None = Field(None, description="no user, the ticket first (default: where the domain has it)")
    max_user_turns: int = Field(30, gt=0)

    def solo_mode(self) -> bool:
        return self.solo if self.solo is not None else self.user is None and self.domain in domain.SOLO_BY_DEFAULT

    @model_validator(mode="after")
    def _consistent(self) -> Tau2Options:
        if self.solo and self.user is not None:
            raise ValueError("solo: true has no user: drop user or solo")
        if self.solo and self.domain and self.domain not in domain.SOLO_DOMAINS:
            raise ValueError(f"τ² domain {self.domain!r} has no solo policy "
                             f"(solo domains: {', '.join(sorted(domain.SOLO_DOMAINS))})")
        return self


def options_for(name: str) -> type[Tau2Options]:
    """The options model of one domain (its ``domain`` fixed, so checks can name it)."""
    return create_model(f"Tau2{name.title()}Options", __base__=Tau2Options,
                        domain=(str, Field(name, description="the τ² domain (fixed)")))


def loader(name: str) -> Any:
    model = options_for(name)

    def load(options: Tau2Options | None, split: str) -> list[dict[str, Any]]:
        return samples(options if options is not None else model(), split)

    return load


def samples(options: Tau2Options, split: str) -> list[dict[str, Any]]:
    """The split's tasks as verl rows: the task's conversation so far, then (without a simulated
    user) the opening user message; the task id as ground truth, which the session reads. With a user,
    the session opens the conversation as τ² does. In solo mode the tasks whose history holds user
    turns are left out (τ² cannot run them solo)."""
    solo = options.solo_mode()
    rows = []
    for task in domain.tasks(options.domain, split):
        if solo and domain.user_in_history(task):
            continue
        opening = [] if options.user is not None else [{"role": "user", "content": domain.opening(task, solo)}]
        # A row needs a message: with a user and no history, the policy (the system prompt) is all it holds.
        prompt = [*domain.chat_messages(domain.history(task)), *opening] or \
            [{"role": "system", "content": domain.policy(options.domain, solo)}]
        rows.append({
            "data_source": f"tau2/{options.domain}",
            "prompt": prompt,
            "reward_model": {"style": "rule", "ground_truth": task.id},
            "extra_info": {"index": len(rows)},
        })
    return rows


def configure(options: Tau2Options) -> dict[str, Any]:
    solo = options.solo_mode()
    session = {"domain": options.domain, "solo": solo, "max_user_turns": options.max_user_turns,
               "user": options.user.model_dump() if options.user else None,
               "judge": options.judge.model_dump() if options.judge else None}
    return {"system_prompt": domain.policy(options.domain, solo), "session_options": session}


def make(name: str, description: str) -> Environment:
    return Environment(
        name=f"tau2-{name}",
        description=description,
        splits={"train": loader(name), "test": loader(name)},
        session="tau2",
        session_options={"domain": name},
        parser="hermes",
        max_turns=30,
        options=options_for(name),
        configure=configure,
    )


AIRLINE = make("airline", "τ²-bench airline: bookings, changes, cancellations under the airline policy.")
RETAIL = make("retail", "τ²-bench retail: orders, returns, exchanges under the retail policy.")
TELECOM = make("telecom", "τ²-bench telecom: technical support (solo: the agent also runs the user's device).")
MOCK = make("mock", "τ²-bench mock: a small task-list domain (9 tasks; solo on request).")
