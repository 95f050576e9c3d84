"""The teachers of on-policy distillation (:mod:`toolrl.algorithms.distill`): models that score the
student's sampled tokens and are never trained. Each loads once, in the controller's process
(``algorithm.teacher.N.engine: transformers``), or is a server that returns prompt log-probs
(``engine: openai``: vLLM or ``toolrl serve``, :class:`ServedTeacher`), and scores a step's
trajectories in one call (:meth:`Teachers.score`), each trajectory's prompt and response as one
sequence: the tool results and template tokens are its context, only the tokens the student sampled
(``response_mask`` 1) get a log-prob (0.0 elsewhere).

A teacher with the student's tokenizer scores the student's own token ids; one with another scores
the student's text, aligned by characters (:mod:`toolrl.algorithms.align`). With ``top`` (opd's
``advantage_options.top_k``, same tokenizer only) it also gives, at each sampled position, its ``top``
likeliest tokens and their log-probs (``teacher_top_ids`` / ``teacher_top_logprobs``): the teacher's
distribution there, for the forward-KL loss and vOPD's baseline (:mod:`.distill`). Everything that would make
a teacher fail is checked before any model loads (:func:`check_teacher`): its tokenizer, its template,
and a run with images (an image's placeholder tokens have no text to align).
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import TYPE_CHECKING, Any

from toolrl import model_sources
from toolrl.algorithms.align import char_ends, pieces, spread
from toolrl.config import ConfigError, one_line

if TYPE_CHECKING:
    from toolrl.config import ModelConfig, TeacherConfig
    from toolrl.trajectory import Trajectory

__all__ = ["ServedTeacher", "Teacher", "TeacherServer", "Teachers", "check_served_teachers", "check_teacher",
           "same_tokenizer", "teacher_index", "teacher_tokenizer"]


def teacher_index(env: str | None, teachers: Sequence[TeacherConfig]) -> int | None:
    """The teacher that scores a trajectory of route ``env``: the first whose ``routes`` hold it (or that
    names none); None when no teacher scores that route."""
    for k, teacher in enumerate(teachers):
        if teacher.routes is None or env in teacher.routes:
            return k
    return None


def teacher_tokenizer(model: ModelConfig, base_dir: str) -> Any:
    """The teacher's tokenizer, without its weights where a source allows (Gemma 3's is read alone)."""
    if model.source == "gemma3-270m":
        return model_sources.load_tokenizer(model_sources.gemma3_270m_tokenizer(model.cache_dir))
    return model_sources.load_tokenizer(model_sources.resolve_source(model, base_dir))


def same_tokenizer(a: Any, b: Any) -> bool:
    """Whether two tokenizers give every text the same ids: the same vocabulary and special tokens."""
    return a.get_vocab() == b.get_vocab() and a.all_special_ids == b.all_special_ids


def special_ids(tokenizer: Any) -> set[int]:
    """The ids of a tokenizer's special tokens, the added ones marked special included (a chat
    template's role markers): what has no text of its own for another tokenizer."""
    added = getattr(tokenizer, "added_tokens_decoder", {}) or {}
    return set(tokenizer.all_special_ids) | {int(i) for i, token in added.items() if getattr(token, "special", False)}


def end_of_turn(tokenizer: Any) -> int:
    """The token the teacher's template ends an assistant turn with: the first token after the turn's
    text in a probe conversation (the tokenizer's eos without a template)."""
    if not getattr(tokenizer, "chat_template", None):
        return int(tokenizer.eos_token_id)
    marker = "Probe answer 4419."
    text = tokenizer.apply_chat_template([{"role": "user", "content": "Probe 4419?"},
                                          {"role": "assistant", "content": marker}], tokenize=False)
    after = text.rpartition(marker)[2]
    ids = tokenizer(after, add_special_tokens=False)["input_ids"]
    special = [i for i in ids if i in special_ids(tokenizer)]
    if not special:
        raise ValueError(f"its template ends an assistant turn with {after!r}, which holds no special token")
    return int(special[0])


def check_teacher(run: Any, teacher: TeacherConfig, where: str) -> list[str]:
    """``teacher`` against the run (:class:`toolrl.roles.run_check.RunFacts`), before any model loads:
    its tokenizer loads; another tokenizer than the student's must have a template that ends a turn
    with a special token (the student's end of turn is scored as it) and a fast tokenizer's character
    offsets; a vision-language student is refused (image tokens have no text). Warns of what the
    alignment approximates."""
    if "vision_config" in run.model_config:
        raise ConfigError(f"{where}: the student takes images, and an image's placeholder tokens have no text a "
                          "teacher could score: distillation is for text-only runs here")
    try:
        # Gemma 3's is built from its package at load, a served teacher needs only its tokenizer; any
        # other: a model directory.
        if teacher.engine == "transformers" and teacher.model.source != "gemma3-270m":
            source = model_sources.resolve_source(teacher.model, run.config.base_dir)
            model_sources.check_model_dir(source, "the teacher")
        tokenizer = teacher_tokenizer(teacher.model, run.config.base_dir)
    except ConfigError as exc:
        raise ConfigError(f"{where}.model: {exc}") from None
    except Exception as exc:
        raise ConfigError(f"{where}.model: its tokenizer does not load: {one_line(str(exc))}") from None
    if same_tokenizer(tokenizer, run.tokenizer):
        return []
    if not getattr(tokenizer, "is_fast", False):
        raise ConfigError(f"{where}.model: another tokenizer than the student's, and not a fast one: its tokens' "
                          "character offsets, which align it with the student's, are unknown")
    try:
        end_of_turn(tokenizer)
    except Exception as exc:
        raise ConfigError(f"{where}.model: its tokenizer cannot render a conversation: {one_line(str(exc))}") from None
    return [f"{where}: another tokenizer than the student's: it scores the student's text aligned by characters, "
            "the prompt rendered by its own template, later tool results as the student's text "
            "(docs/distillation.md)"]


# A trajectory's prompt as chat messages (its sample's), for a teacher of another tokenizer to render
# with its own template; None where they are not known (a recorded trajectory, a forked piece).
Conversation = Callable[["Trajectory"], "list[dict[str, Any]] | None"]


# A trajectory to score: the teacher's ids, the first of them scored, and (a teacher of another tokenizer)
# where each sampled student token's share lies (start, teacher positions, char spans, student ends).
Scored = list[tuple[int, list[int], list[tuple[int, int]], list[int]]]

# A sequence's scores from ids[first:]: each token's log-prob, and at each position the teacher's ``top``
# likeliest tokens as (id, log-prob), best first (empty lists without ``top``).
Scores = tuple[list[float], list[list[tuple[int, float]]]]


class Teacher:
    """One teacher, loaded: ``score`` fills ``teacher_logprobs`` of the trajectories it is given. This
    one runs its model in this process; :class:`ServedTeacher` asks a server."""

    def __init__(self, config: TeacherConfig, student_tokenizer: Any, base_dir: str) -> None:
        path = model_sources.resolve_source(config.model, base_dir)
        self._bind(model_sources.load_tokenizer(path), student_tokenizer)
        self.device = model_sources.resolve_device(config.model.device)
        self.model = model_sources.load_model(path, config.model.dtype, self.device).eval()

    def _bind(self, tokenizer: Any, student_tokenizer: Any) -> None:
        self.tokenizer = tokenizer
        self.same = same_tokenizer(self.tokenizer, student_tokenizer)
        self.student = student_tokenizer
        self.end = None if self.same else end_of_turn(self.tokenizer)

    def token_logprobs(self, ids: Sequence[int], first: int, top: int = 0) -> Scores:
        """The teacher's log-prob of each of ``ids[first:]`` given the ids before it, and its ``top``
        likeliest tokens there (one forward)."""
        import torch

        with torch.no_grad():
            x = torch.tensor([list(ids)], device=self.device)
            logits = self.model(input_ids=x, logits_to_keep=len(ids) - first + 1).logits[0, :-1].float()
            all_lp = torch.log_softmax(logits, -1)
            lp = all_lp.gather(-1, x[0, first:, None])[:, 0]
            values, indices = all_lp.topk(top, -1) if top else (None, None)
            best = [[] for _ in range(len(lp))] if values is None else [
                list(zip(i, v, strict=True)) for i, v in zip(indices.cpu().tolist(), values.cpu().tolist(), strict=True)]
        return lp.cpu().tolist(), best

    def logprobs(self, sequences: Sequence[tuple[list[int], int]], top: int = 0) -> list[Scores]:
        """:meth:`token_logprobs` of each (ids, first): a step's sequences at once."""
        return [self.token_logprobs(ids, first, top) for ids, first in sequences]

    def score(self, trajectories: Sequence[Trajectory], conversation: Conversation | None = None,
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
        for (t, _, first, scored), (lp, best) in zip(
                plans, self.logprobs([(ids, first) for _, ids, first, _ in plans], top), strict=True):
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
            run: list[int] = []
            for k, token in enumerate([*chunk, None]):
                if token is not None and token not in special:
                    run.append(token)
                    continue
                if run:  # the text the student sampled, encoded by the teacher
                    text, ends = char_ends(self.student, run)
                    enc = self.tokenizer(text, add_special_tokens=False, return_offsets_mapping=True)
                    scored.append((piece.start + k - len(run), list(range(len(ids), len(ids) + len(enc["input_ids"]))),
                                   [tuple(span) for span in enc["offset_mapping"]], ends))
                    ids += enc["input_ids"]
                    run = []
                if token is not None:  # the student's end of turn, scored as the teacher's
                    scored.append((piece.start + k, [len(ids)], [(0, 1)], [1]))
                    ids.append(self.end)
        return ids, scored

    def _encode(self, text: str) -> list[int]:
        return self.tokenizer(text, add_special_tokens=False)["input_ids"] if text else []


class TeacherServer:
    """The server of a teacher with ``engine: openai`` (vLLM, ``toolrl serve``): sequences go out as
    concurrent ``/v1/completions`` requests for vLLM's ``prompt_logprobs``; its errors name the
    teacher (``where``)."""

    def __init__(self, config: TeacherConfig, where: str) -> None:
        assert config.options is not None
        self.options, self.served_model = config.options, config.served_model
        self.url = config.options.base_url.rstrip("/") + "/completions"
        self.where = f"{where} (engine openai at {config.options.base_url})"

    def probe(self, tokenizer: Any, top: int = 0) -> None:
        """One short prompt scored (with ``top`` likeliest tokens a position), or a ConfigError: a server
        that does not answer, refuses, or returns no prompt log-probs (or fewer than ``top``)."""
        try:
            self.logprobs([(tokenizer("Probe 4419: the teacher scores this.", add_special_tokens=False)["input_ids"], 1)],
                          top)
        except ValueError as exc:
            raise ConfigError(str(exc)) from None

    def logprobs(self, sequences: Sequence[tuple[list[int], int]], top: int = 0) -> list[Scores]:
        """The log-probs of each (ids, first)'s ``ids[first:]`` (and the ``top`` likeliest tokens at each
        position), all requests at once (up to ``options.max_concurrency`` in flight)."""
        try:
            asyncio.get_running_loop()
        except RuntimeError:  # a step's scoring: the controller's worker thread
            return asyncio.run(self._requests(sequences, top))
        with ThreadPoolExecutor(1) as pool:  # the probe, while the run starts on the event loop
            return pool.submit(asyncio.run, self._requests(sequences, top)).result()

    async def _requests(self, sequences: Sequence[tuple[list[int], int]], top: int) -> list[Scores]:
        import aiohttp  # lazy: only a served teacher's scoring needs the HTTP client

        gate = asyncio.Semaphore(self.options.max_concurrency)
        headers = {"Authorization": f"Bearer {self.options.api_key}"} if self.options.api_key else {}
        timeout = aiohttp.ClientTimeout(total=self.options.timeout_s)

        async def one(session: aiohttp.ClientSession, ids: list[int], first: int) -> Scores:
            # max_tokens 1: vLLM samples at least one token; prompt_logprobs: the prompt's own tokens and the
            # top likeliest at each position.
            body = {"model": self.served_model, "prompt": ids, "max_tokens": 1, "temperature": 0.0,
                    "prompt_logprobs": top}
            async with gate:
                try:
                    async with session.post(self.url, json=body) as resp:
                        text, status = await resp.text(), resp.status
                except (aiohttp.ClientError, asyncio.TimeoutError, OSError) as exc:
                    raise ValueError(f"{self.where}: the server does not answer: "
                                     f"{one_line(str(exc)) or type(exc).__name__}") from None
            return self._read(status, text, ids, first, top)

        async with aiohttp.ClientSession(headers=headers, timeout=timeout) as session:
            return list(await asyncio.gather(*(one(session, ids, first) for ids, first in sequences)))

    def _read(self, status: int, text: str, ids: list[int], first: int, top: int) -> Scores:
        """The log-probs of ``ids[first:]`` (and the entries ranked 1 to ``top`` at each position) from a
        completions answer, or a ValueError naming the teacher."""
        try:
            body = json.loads(text)
        except ValueError:
            body = None
        if status != 200:
            error = body.get("error") if isinstance(body, dict) else None
            message = error.get("message") if isinstance(error, dict) else text[:300]
            raise ValueError(f"{self.where}: the server refused to score a prompt (HTTP {status}): "
                             f"{one_line(str(message))}")
        try:
            rows = body["choices"][0]["prompt_logprobs"]
            chosen = [float(rows[j][str(ids[j])]["logprob"]) for j in range(first, len(ids))]
            best = [sorted((int(e["rank"]), int(i), float(e["logprob"])) for i, e in rows[j].items() if e["rank"] <= top)
                    for j in range(first, len(ids))] if top else [[] for _ in chosen]
        except (KeyError, IndexError, TypeError, ValueError):
            raise ValueError(f"{self.where}: the server does not return prompt log-probs (vLLM's prompt_logprobs "
                             "on /v1/completions), which a teacher needs") from None
        if any(len(b) != top for b in best):
            raise ValueError(f"{self.where}: the server returned fewer than the {top} likeliest tokens asked for "
                             "(prompt_logprobs)")
        return chosen, [[(i, v) for _, i, v in b] for b in best]


def check_served_teachers(teachers: Sequence[TeacherConfig], base_dir: str, where: str, top: int = 0) -> None:
    """Each teacher with ``engine: openai`` asked to score a short prompt, at the start of a run before any
    weights load (``--check`` reaches no server): a ConfigError naming the first that cannot."""
    for k, config in enumerate(teachers):
        if config.engine == "openai":
            TeacherServer(config, f"{where}.{k}").probe(teacher_tokenizer(config.model, base_dir), top)


class ServedTeacher(Teacher):
    """A teacher on an OpenAI-compatible server (:class:`TeacherServer`): only its tokenizer loads here."""

    def __init__(self, config: TeacherConfig, student_tokenizer: Any, base_dir: str, where: str) -> None:
        self.server = TeacherServer(config, where)
        self._bind(teacher_tokenizer(config.model, base_dir), student_tokenizer)

    def logprobs(self, sequences: Sequence[tuple[list[int], int]], top: int = 0) -> list[Scores]:
        return self.server.logprobs(sequences, top)


class Teachers:
    """The run's teachers (``algorithm.teacher``), loaded once; :meth:`score` gives every trajectory of a
    batch its route's teacher's log-probs (those of routes no teacher scores stay None)."""

    def __init__(self, configs: Sequence[TeacherConfig], student_tokenizer: Any, base_dir: str,
                 conversation: Conversation | None = None, top: int = 0) -> None:
        self.configs = list(configs)
        self.teachers = [ServedTeacher(c, student_tokenizer, base_dir, f"algorithm.teacher.{k}")
                         if c.engine == "openai" else Teacher(c, student_tokenizer, base_dir)
                         for k, c in enumerate(self.configs)]
        self.conversation = conversation
        self.top = top  # each position's top-k from every teacher (opd's top_k)

    def score(self, trajectories: Sequence[Trajectory]) -> None:
        by_teacher: dict[int, list[Trajectory]] = {}
        for t in trajectories:
            k = teacher_index(t.env, self.configs)
            if k is not None:
                by_teacher.setdefault(k, []).append(t)
        for k, batch in by_teacher.items():
            self.teachers[k].score(batch, self.conversation, self.top)
