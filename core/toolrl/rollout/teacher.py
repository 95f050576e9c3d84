"""The teachers of on-policy distillation (:mod:`toolrl.algorithms.distill`): any registered engine whose
``prompt_logprobs`` scores given tokens, checked and built as the run's engine is (:func:`teacher_config`),
never trained. :meth:`Teachers.score` gives each trajectory its route's teacher's log-probs at the tokens
the student sampled (0.0 elsewhere); a teacher of another tokenizer scores the student's text aligned by
characters (:mod:`toolrl.algorithms.align`). Which engines teach, when, and how turn ends and ``top`` are
treated: docs/distillation.md.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

from toolrl import model_sources
from toolrl.algorithms.align import char_ends, pieces, spread
from toolrl.algorithms.distill import teacher_index
from toolrl.config import Config, ConfigError, EngineConfig, one_line
from toolrl.engines import RolloutEngine
from toolrl.engines.build import build_engine, engine_options
from toolrl.plugins.parts import RunFacts, checked_options, lookup_part

if TYPE_CHECKING:
    from toolrl.config import TeacherConfig
    from toolrl.trajectory import Trajectory

__all__ = ["Teacher", "Teachers", "check_teachers", "open_teachers"]

# A trajectory's prompt as chat messages (its sample's), for a teacher of another tokenizer to render
# with its own template; None where they are not known (a recorded trajectory, a forked piece).
Conversation = Callable[["Trajectory"], "list[dict[str, Any]] | None"]

# A trajectory to score: the teacher's ids, the first of them scored, and (a teacher of another tokenizer)
# where each sampled student token's share lies (start, teacher positions, char spans, student ends).
Scored = list[tuple[int, list[int], list[tuple[int, int]], list[int]]]

# A sequence's scores from ids[first:]: each token's log-prob, and at each position the teacher's ``top``
# likeliest tokens as (id, log-prob), best first (empty lists without ``top``).
Scores = tuple[list[float], list[list[tuple[int, float]]]]

PROBE = "Probe 4419: the teacher scores this."


def teacher_config(config: Config, teacher: TeacherConfig) -> Config:
    """The run as its teacher's engine sees it: the teacher's model and engine in place of the run's
    (``options`` as ``engine.options``, ``batch_size`` as ``engine.max_batch_size``), read from no file (its
    errors name the fields as the run's, after the teacher's place)."""
    as_teacher = config.model_copy(update={"model": teacher.model, "engine": EngineConfig(
        name=teacher.engine, max_batch_size=teacher.batch_size, options=teacher.options)})
    as_teacher._origin = (None, "", ())
    return as_teacher


def same_tokenizer(a: Any, b: Any) -> bool:
    """Whether two tokenizers give every text the same ids: the same vocabulary and special tokens (one
    tokenizer, or two of one size, before their 151k-entry vocabularies are built and compared)."""
    return a is b or (len(a) == len(b) and a.get_vocab() == b.get_vocab() and a.all_special_ids == b.all_special_ids)


def special_ids(tokenizer: Any) -> set[int]:
    """The ids of a tokenizer's special tokens, the added ones marked special included (a chat
    template's role markers): what has no text of its own for another tokenizer."""
    added = getattr(tokenizer, "added_tokens_decoder", {}) or {}
    return set(tokenizer.all_special_ids) | {int(i) for i, token in added.items() if getattr(token, "special", False)}


# A conversation the teacher's template renders to find, and to measure, how it ends an assistant turn.
PROBE_TURN = [{"role": "user", "content": "Probe 4419?"}, {"role": "assistant", "content": "Probe answer 4419."}]


def probe_turn(tokenizer: Any) -> tuple[str, str]:
    """:data:`PROBE_TURN` rendered by the teacher's template: the text up to the end of the answer, and what
    the template puts after it (("", "") without a template)."""
    if not getattr(tokenizer, "chat_template", None):
        return "", ""
    marker = PROBE_TURN[-1]["content"]
    before, _, after = tokenizer.apply_chat_template(PROBE_TURN, tokenize=False).rpartition(marker)
    return before + marker, after


def end_of_turn(tokenizer: Any) -> int:
    """The token the teacher's template ends an assistant turn with: the first token after the turn's
    text in a probe conversation (the tokenizer's eos without a template)."""
    if not getattr(tokenizer, "chat_template", None):
        return int(tokenizer.eos_token_id)
    after = probe_turn(tokenizer)[1]
    ids = tokenizer(after, add_special_tokens=False)["input_ids"]
    special = [i for i in ids if i in special_ids(tokenizer)]
    if not special:
        raise ValueError(f"its template ends an assistant turn with {after!r}, which holds no special token")
    return int(special[0])


def check_teachers(facts: RunFacts, top: int) -> list[str]:
    """Each of ``algorithm.teacher`` against the run, before any model loads (``top``: the likeliest tokens
    asked at each position): a vision-language student is refused (image tokens have no text)."""
    teachers = facts.config.algorithm.teachers
    where = facts.where("algorithm.teacher")
    if teachers and "vision_config" in facts.model_config:
        raise ConfigError(f"{where}: the student takes images, and an image's placeholder tokens have no text a "
                          "teacher could score: distillation is for text-only runs here")
    return [w for k, teacher in enumerate(teachers) for w in check_teacher(facts, teacher, f"{where}.{k}", top)]


def check_teacher(facts: RunFacts, teacher: TeacherConfig, where: str, top: int) -> list[str]:
    """One teacher: an engine that scores given tokens, its options and its own run check on the
    teacher's model (:func:`teacher_config`), its tokenizer loads; another tokenizer than the student's must
    have a template that ends a turn with a special token (the student's end of turn is scored as it),
    fast offsets, and no ``top``. Warns of what the alignment approximates."""
    as_teacher = teacher_config(facts.config, teacher)
    cls = lookup_part("rollout_engines", teacher.engine, f"{where}.engine")
    if getattr(cls, "prompt_logprobs", None) is RolloutEngine.prompt_logprobs:
        raise ConfigError(f"{where}.engine: the {teacher.engine} engine does not score given tokens "
                          "(RolloutEngine.prompt_logprobs), which is what a teacher does")
    try:
        path = model_sources.model_path(as_teacher)
        tokenizer = model_sources.load_tokenizer(path)
    except ConfigError as exc:
        raise ConfigError(f"{where}.{exc}") from None
    except Exception as exc:
        raise ConfigError(f"{where}.model: its tokenizer does not load: {one_line(str(exc))}") from None
    read = model_sources.model_config(path)
    try:
        checked_options(cls, engine_options(as_teacher), "engine.options")
        teacher_facts = RunFacts(as_teacher, path, read, model_sources.text_config(read), tokenizer, None)
        warnings = list(cls.check_run(teacher_facts))
    except (ConfigError, ValueError) as exc:
        raise ConfigError(f"{where}: {one_line(str(exc))}") from None
    if same_tokenizer(tokenizer, facts.tokenizer):
        return warnings
    if top:
        raise ConfigError(f"{where}.model: its tokenizer is not the student's, so its likeliest tokens are not the "
                          f"student's tokens: algorithm.advantage_options top_k={top} needs the student's tokenizer")
    if not getattr(tokenizer, "is_fast", False):
        raise ConfigError(f"{where}.model: another tokenizer than the student's, and not a fast one: its tokens' "
                          "character offsets, which align it with the student's, are unknown")
    try:
        end_of_turn(tokenizer)
    except Exception as exc:
        raise ConfigError(f"{where}.model: its tokenizer cannot render a conversation: {one_line(str(exc))}") from None
    return [*warnings, f"{where}: another tokenizer than the student's: it scores the student's text aligned by "
            "characters, the prompt rendered by its own template, later tool results as the student's text "
            "(docs/distillation.md)"]


class Teacher:
    """One teacher: its engine and tokenizer; :meth:`score` fills ``teacher_logprobs`` of the trajectories
    it is given."""

    def __init__(self, engine: RolloutEngine, tokenizer: Any, student_tokenizer: Any) -> None:
        self.engine = engine
        self.tokenizer = tokenizer
        self.same = same_tokenizer(tokenizer, student_tokenizer)
        self.student = student_tokenizer
        self.end = None if self.same else end_of_turn(tokenizer)
        # Whether the teacher has learnt to end a turn with ``end`` (:func:`ends_turns`, measured when it
        # opens): a teacher that has not gives the student's end of turn no term of its own.
        self.ends_turns = True

    async def logprobs(self, sequences: Sequence[tuple[list[int], int]], top: int = 0) -> list[Scores]:
        """The log-prob of each (ids, first)'s ``ids[first:]`` given the ids before it, and its ``top``
        likeliest tokens there: the engine's prompt scores, from the first scored token on."""
        scored = await self.engine.prompt_logprobs([ids for ids, _ in sequences], top,
                                                   start=[first for _, first in sequences])
        return [(s.logprobs, s.top) for s in scored]

    async def score(self, trajectories: Sequence[Trajectory], conversation: Conversation | None = None,
                    top: int = 0) -> None:
        """Each trajectory's ``teacher_logprobs`` (and with ``top``, its ``teacher_top_ids`` and
        ``teacher_top_logprobs``: the same tokenizer's only); ``conversation`` gives a teacher of another
        tokenizer the prompt's messages, which it renders with its own chat template."""
        if top and not self.same:
            raise ValueError("a teacher of another tokenizer has no top-k over the student's tokens")
        plans: list[tuple[Trajectory, list[int], int, Scored | None]] = []
        for t in trajectories:
            if t.images:
                raise ValueError(f"trajectory {t.trajectory_id}: holds images, whose tokens no teacher can score")
            if not any(t.response_mask):
                t.teacher_logprobs = [0.0] * len(t.response_ids)
                if top:
                    t.teacher_top_ids, t.teacher_top_logprobs = [[] for _ in t.response_ids], [[] for _ in t.response_ids]
            elif self.same:
                plans.append((t, t.prompt_ids + t.response_ids, len(t.prompt_ids), None))
            else:
                ids, scored = self.across(t, None if conversation is None else conversation(t))
                if scored:
                    plans.append((t, ids, min(j for _, js, _, _ in scored for j in js), scored))
                else:
                    t.teacher_logprobs = [0.0] * len(t.response_ids)
        scores = await self.logprobs([(ids, first) for _, ids, first, _ in plans], top) if plans else []
        for (t, _, first, scored), (lp, best) in zip(plans, scores, strict=True):
            if scored is None:
                t.teacher_logprobs = [v if m else 0.0 for v, m in zip(lp, t.response_mask, strict=True)]
                if top:
                    tops = [b if m else [] for b, m in zip(best, t.response_mask, strict=True)]
                    t.teacher_top_ids = [[i for i, _ in b] for b in tops]
                    t.teacher_top_logprobs = [[v for _, v in b] for b in tops]
                continue
            out = [0.0] * len(t.response_ids)
            for start, js, spans, ends in scored:
                for k, v in enumerate(spread(ends, spans, [lp[j - first] for j in js])):
                    out[start + k] = v
            if not self.ends_turns:  # its end-of-turn score is noise: the student's own, advantage 0 there
                for k in self.turn_ends(t):
                    out[k] = t.logprobs[k]
            t.teacher_logprobs = out

    def across(self, t: Trajectory, messages: list[dict[str, Any]] | None = None) -> tuple[list[int], Scored]:
        """A trajectory in the teacher's tokens (:mod:`toolrl.algorithms.align`) and where each sampled
        student token's share of them lies; its prompt rendered by the teacher's template from
        ``messages`` when given, else the student's prompt as text."""
        special = special_ids(self.student)
        ids: list[int] = [self.tokenizer.bos_token_id] if self.tokenizer.bos_token_id is not None else []
        # Per sampled student token: the teacher tokens (index into ids, char span) of its piece, and its ends.
        scored: Scored = []
        context = [i for i in t.prompt_ids if i not in special]
        if messages is not None and getattr(self.tokenizer, "chat_template", None):
            ids = self._encode(self.tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False))
            context = []
        for piece in pieces(t.response_mask):
            chunk = t.response_ids[piece.start:piece.end]
            if not piece.sampled:
                context += [i for i in chunk if i not in special]
                continue
            ids += self._encode(self.student.decode(context, clean_up_tokenization_spaces=False))
            context = []
            sampled: list[int] = []
            for k, token in enumerate([*chunk, None]):
                if token is not None and token not in special:
                    sampled.append(token)
                    continue
                if sampled:  # the text the student sampled, encoded by the teacher
                    text, ends = char_ends(self.student, sampled)
                    enc = self.tokenizer(text, add_special_tokens=False, return_offsets_mapping=True)
                    scored.append((piece.start + k - len(sampled), list(range(len(ids), len(ids) + len(enc["input_ids"]))),
                                   [tuple(span) for span in enc["offset_mapping"]], ends))
                    ids += enc["input_ids"]
                    sampled = []
                if token is not None:  # the student's end of turn, scored as the teacher's
                    scored.append((piece.start + k, [len(ids)], [(0, 1)], [1]))
                    ids.append(self.end)
        return ids, scored

    def turn_ends(self, t: Trajectory) -> list[int]:
        """The sampled positions of the student's special tokens (its end of turn), scored as the teacher's
        end of turn by :meth:`across`."""
        special = special_ids(self.student)
        return [k for k, (token, m) in enumerate(zip(t.response_ids, t.response_mask, strict=True))
                if m and token in special]

    def _encode(self, text: str) -> list[int]:
        return self.tokenizer(text, add_special_tokens=False)["input_ids"] if text else []


class Teachers:
    """The run's teachers (``algorithm.teacher``), built once; :meth:`score` gives every trajectory of a
    group its route's teacher's log-probs (those of routes no teacher scores stay None)."""

    def __init__(self, configs: Sequence[TeacherConfig], teachers: Sequence[Teacher],
                 conversation: Conversation | None = None, top: int = 0) -> None:
        self.configs, self.teachers = list(configs), list(teachers)
        self.conversation = conversation
        self.top = top  # each position's top-k from every teacher (opd's top_k)

    async def score(self, trajectories: Sequence[Trajectory]) -> None:
        by_teacher: dict[int, list[Trajectory]] = {}
        for t in trajectories:
            k = teacher_index(t.env, self.configs)
            if k is not None:
                by_teacher.setdefault(k, []).append(t)
        for k, batch in by_teacher.items():
            await self.teachers[k].score(batch, self.conversation, self.top)

    async def close(self) -> None:
        for teacher in self.teachers:
            await teacher.engine.close()


async def open_teachers(config: Config, student_tokenizer: Any, where: str, conversation: Conversation | None = None,
                        top: int = 0) -> Teachers:
    """``algorithm.teacher``'s engines, each built as the run's engine is (:func:`build_engine` on
    :func:`teacher_config`) and asked to score a probe prompt (``top`` likeliest tokens a position): a
    teacher that cannot (an engine that does not score given tokens, a server that does not answer or
    returns no prompt log-probs) is a one-line ConfigError naming it (``where.k``)."""
    teachers: list[Teacher] = []
    try:
        for k, config_k in enumerate(config.algorithm.teachers):
            as_teacher, named = teacher_config(config, config_k), f"{where}.{k} (engine {config_k.engine})"
            path = model_sources.model_path(as_teacher)
            tokenizer = model_sources.load_tokenizer(path)
            try:
                teachers.append(Teacher(build_engine(as_teacher, path, tokenizer), tokenizer, student_tokenizer))
            except ConfigError as exc:
                raise ConfigError(f"{named}: {exc}") from None
            await _probe(teachers[-1], named, top)
            if not teachers[-1].same:
                teachers[-1].ends_turns = await ends_turns(teachers[-1])
    except BaseException:
        await Teachers([], teachers).close()
        raise
    return Teachers(config.algorithm.teachers, teachers, conversation, top)


async def ends_turns(teacher: Teacher) -> bool:
    """Whether a teacher of another tokenizer has learnt its template's end of turn: its log-prob of it after
    an answer in a turn its template renders (:data:`PROBE_TURN`) is above a guess uniform over its
    vocabulary: a base model's is far below, an instruct model's is not (measured in docs/distillation.md)."""
    text = probe_turn(teacher.tokenizer)[0] or PROBE_TURN[-1]["content"]
    ids = [*teacher._encode(text), teacher.end]
    (lp, _), = await teacher.logprobs([(ids, len(ids) - 1)])
    return lp[-1] > -math.log(len(teacher.tokenizer))


async def _probe(teacher: Teacher, named: str, top: int) -> None:
    ids = teacher.tokenizer(PROBE, add_special_tokens=False)["input_ids"]
    try:
        (scored,) = await teacher.engine.prompt_logprobs([ids], top)
    except Exception as exc:  # the engine's own words: a refusal, a server that does not answer
        raise ConfigError(f"{named}: {one_line(str(exc)) or type(exc).__name__}") from None
    if len(scored.logprobs) != len(ids) - 1 or len(scored.top) != len(ids) - 1 or any(len(b) != top for b in scored.top):
        raise ConfigError(f"{named}: a probe of {len(ids)} tokens scored as {len(scored.logprobs)} log-probs and "
                          f"{sorted({len(b) for b in scored.top})} likeliest tokens a position: a teacher gives every "
                          f"token after the first its log-prob and the {top} likeliest tokens asked for")
