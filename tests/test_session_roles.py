"""Roles in toolrl's own loop: an environment session says which role takes each model turn
(``EnvironmentSession.role``); a change of role closes the piece and the next piece's prompt is the whole
context, so each piece is one role's (``Trajectory.role``); under model.adapters each turn is sampled
with its role's adapter. A run with no roles never asks. Real tokenizer, template and parser; the engine
says a script."""

import pytest
from toolrl.config import RewardConfig, RolloutConfig
from toolrl.model_sources import qwen_tokenizer
from toolrl.parsers.hermes import HermesParser
from toolrl.renderers.chat import ChatRenderer
from toolrl.rollout import RolloutContext, Route, run_trajectory_pieces
from toolrl.schemas import Sample
from toolrl.sessions import EnvironmentSession, SessionKind
from toolrl.testing import ScriptedEngine

SAMPLE = Sample(prompt=[{"role": "user", "content": "Is 91 prime?"}])
TEXTS = ["91 is prime.", "Check 7 * 13.", "91 = 7 * 13: not prime.", "Accepted."]
ROLES = ("solver", "verifier")


class Debate(EnvironmentSession):
    """The solver answers, the verifier replies to it, and so on: four turns, a user turn between them."""

    roles = ROLES

    def __init__(self, options, context):
        super().__init__(options, context)
        self.turn = -1
        self.asked = 0

    async def role(self):
        self.turn += 1
        return ROLES[self.turn % 2]

    async def respond(self, message):
        self.asked += 1
        return "Go on." if self.asked < 4 else None


class Silent(Debate):
    """Names no role: the run's first acts throughout."""

    async def role(self):
        return None


class Rogue(Debate):
    async def role(self):
        return "judge"


class Unready(Debate):
    async def reset(self, sample):
        raise RuntimeError("no board")


class Asked(Debate):
    """Fails if asked: in a run with no roles the loop must not ask."""

    async def role(self):
        raise AssertionError("a run with no roles asked for a role")


class Game(Debate):
    """The solver wins: each role's reward, the episode's score the solver's."""

    async def score(self, trajectory):
        return 1.0

    async def role_rewards(self):
        return {"solver": 1.0, "verifier": -1.0}


class Cheat(Game):
    async def role_rewards(self):
        return {"solver": 1.0, "judge": 0.0}


class AdapterEngine(ScriptedEngine):
    """A scripted engine that takes the ``adapter`` keyword engines take under model.adapters, and keeps it."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.adapters = []
        self.ended = []

    async def generate(self, prompt_ids, params, n=1, session_id=None, images=(), adapter=None):
        self.adapters.append(adapter)
        return await super().generate(prompt_ids, params, n, session_id, images)

    def end_session(self, session_id):
        self.ended.append(session_id)


@pytest.fixture(scope="module")
def tokenizer():
    return qwen_tokenizer("qwen2_5")


def context(tokenizer, session, roles=ROLES, adapters=False):
    kind = SessionKind(session.__name__.lower(), session, session.Options(), ".")
    engine = (AdapterEngine if adapters else ScriptedEngine)(tokenizer, TEXTS)
    return RolloutContext(engine=engine, renderer_factory=lambda schemas: ChatRenderer(tokenizer, schemas),
                          config=RolloutConfig(max_response_tokens=4096),
                          routes={None: Route({}, 8, HermesParser(), [], RewardConfig(), kind)},
                          roles=roles, adapters=adapters)


def model_tokens(piece):
    return [t for t, m in zip(piece.response_ids, piece.response_mask) if m]


async def test_a_session_that_alternates_roles_gives_a_piece_per_turn_each_with_its_role(tokenizer):
    ctx = context(tokenizer, Debate)
    pieces = await run_trajectory_pieces(ctx, SAMPLE, 0, "t0", 0)
    assert [p.role for p in pieces] == ["solver", "verifier", "solver", "verifier"]
    assert [p.termination for p in pieces] == ["forked"] * 3 + ["answered"]
    assert [p.piece for p in pieces] == [0, 1, 2, 3] and {p.trajectory_key for p in pieces} == {"t0"}
    assert [model_tokens(p) for p in pieces] == [c.generated[0] for c in ctx.engine.calls]
    for before, after in zip(pieces, pieces[1:]):
        # The new piece's prompt is the whole context the turn was generated from: the earlier piece's
        # tokens and the user turn after them, as the engine was prompted.
        assert after.prompt_ids[:len(before.prompt_ids) + len(before.response_ids)] == \
            before.prompt_ids + before.response_ids
    assert [p.prompt_ids for p in pieces] == [c.prompt_ids for c in ctx.engine.calls]


async def test_the_first_role_acts_when_the_session_names_none_and_a_role_the_run_lacks_fails_it(tokenizer):
    pieces = await run_trajectory_pieces(context(tokenizer, Silent), SAMPLE, 0, "t0", 0)
    assert [(p.role, p.turns) for p in pieces] == [("solver", 4)]
    pieces = await run_trajectory_pieces(context(tokenizer, Rogue), SAMPLE, 0, "t0", 0)
    assert pieces[-1].termination == "error" and "'judge' is not one of the run's roles" in pieces[-1].error


async def test_a_data_row_names_the_role_that_acts_first(tokenizer):
    row = SAMPLE.model_copy(update={"extra_info": {"role": "verifier"}})
    pieces = await run_trajectory_pieces(context(tokenizer, Silent), row, 0, "t0", 0)
    assert [(p.role, p.turns) for p in pieces] == [("verifier", 4)]


async def test_a_trajectory_that_ends_before_its_first_turn_is_its_first_roles(tokenizer):
    """Every piece has a role in a run with roles (under model.adapters each trains its role's adapter)."""
    (piece,) = await run_trajectory_pieces(context(tokenizer, Unready), SAMPLE, 0, "t0", 0)
    assert (piece.role, piece.termination, piece.turns) == ("solver", "error", 0)


async def test_under_adapters_each_turn_is_sampled_with_its_roles_adapter_and_a_fresh_cache(tokenizer):
    ctx = context(tokenizer, Debate, adapters=True)
    pieces = await run_trajectory_pieces(ctx, SAMPLE, 0, "t0", 0)
    assert ctx.engine.adapters == ["solver", "verifier", "solver", "verifier"]
    assert ctx.engine.ended[:3] == ["t0"] * 3 and len(pieces) == 4


async def test_a_run_without_roles_never_asks_and_is_one_piece(tokenizer):
    ctx = context(tokenizer, Asked, roles=())
    pieces = await run_trajectory_pieces(ctx, SAMPLE, 0, "t0", 0)
    assert [(p.role, p.turns, p.termination) for p in pieces] == [(None, 4, "answered")]
    again = await run_trajectory_pieces(context(tokenizer, Debate, roles=()), SAMPLE, 0, "t0", 0)
    assert again[0].response_ids == pieces[0].response_ids


async def test_a_sessions_role_rewards_reach_every_piece(tokenizer):
    """A game's players win and lose against each other: each role's own reward, which its baseline compares."""
    pieces = await run_trajectory_pieces(context(tokenizer, Game), SAMPLE, 0, "t0", 0)
    assert len(pieces) == 4 and all(p.role_rewards == {"solver": 1.0, "verifier": -1.0} and p.reward == 1.0
                                    for p in pieces)
    (piece,) = await run_trajectory_pieces(context(tokenizer, Game, roles=()), SAMPLE, 0, "t0", 0)
    assert piece.role_rewards == {} and piece.reward == 1.0  # a run with no roles never asks
    pieces = await run_trajectory_pieces(context(tokenizer, Cheat), SAMPLE, 0, "t0", 0)
    assert all(p.role_rewards == {} for p in pieces) and pieces[-1].reward == 0.0
    assert "role_rewards: 'judge' is not one of the run's roles" in pieces[-1].reward_errors["cheat"]
