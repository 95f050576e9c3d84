"""The trainer on a vision-language model (tiny Qwen2.5-VL): packed forwards with images agree with
the model's own forward, GRPO steps train (never on image tokens), micro-batches count image tokens,
the vision tower trains or stays frozen by config, LoRA adapts the language model only, export writes a
directory transformers loads whole, and the trainer's log-probs of trajectories the transformers engine
sampled (images in the prompt and a tool result) are the engine's. Two FSDP2 ranks on Ray train like one
in test_sharded_training, on that module's Ray cluster, with this module's fixtures."""

from __future__ import annotations

import io
import json
import logging
from pathlib import Path

import pytest
import torch
from test_prefix_sharing import loss_and_grads
from toolrl import model_sources
from toolrl.config import Config, ConfigError, load_config
from toolrl.training import packing, prefix_tree
from toolrl.training.microbatch import plan
from toolrl.training.packing import build_batch, input_length
from toolrl.training.step import Policy, StepOptions, response_logprobs, train_step
from toolrl.trajectory import Trajectory
from vision_fixtures import image, vision_trajectory

pytest.importorskip("PIL")
ROOT = Path(__file__).resolve().parents[1]
TINY = str(ROOT / "examples" / "tiny.yaml")


@pytest.fixture(scope="module")
def vlm_path() -> str:
    return model_sources.tiny_qwen2_5_vl()


@pytest.fixture(scope="module")
def processor(vlm_path):
    return model_sources.load_processor(vlm_path)


@pytest.fixture
def vlm(vlm_path):
    return model_sources.load_model(vlm_path)


@pytest.fixture(scope="module")
def trajectories(processor):
    """Two groups; the first group's trajectories share the figure (processed once)."""
    figure = image(100, 60)
    return [vision_trajectory(processor, "a", figure, image(40, 40, 1), "x = 4", group=0, reward=1.0),
            vision_trajectory(processor, "b", figure, image(30, 50, 3), "x is 12", group=0, reward=0.0),
            vision_trajectory(processor, "c", image(60, 90, 2), None, "no", group=1, reward=0.5, tool_image=False),
            vision_trajectory(processor, "d", image(70, 50, 4), image(50, 30, 5), "x = 7", group=1, reward=0.0)]


def reference_logprobs(model, processor, t) -> torch.Tensor:
    """The model's own forward on one sequence: input ids, pixel values, grids and its token types
    (from which the model computes its 3-D positions), log-softmax at the response positions."""
    from PIL import Image

    ids = torch.tensor([t.prompt_ids + t.response_ids], device=model.device)
    pixels = processor.image_processor(images=[Image.open(io.BytesIO(i.png)) for i in t.images], return_tensors="pt")
    with torch.no_grad():
        logits = model(input_ids=ids, pixel_values=pixels["pixel_values"].to(model.device, model.dtype),
                       image_grid_thw=pixels["image_grid_thw"].to(model.device),
                       mm_token_type_ids=(ids == processor.image_token_id).int()).logits[0]
    lp = torch.log_softmax(logits.float(), -1)
    p = len(t.prompt_ids)
    return torch.tensor([lp[p + j - 1, tok].item() if m else 0.0
                         for j, (tok, m) in enumerate(zip(t.response_ids, t.response_mask, strict=True))])


@pytest.mark.parametrize("packed", [True, False])
def test_logprobs_match_the_models_forward(vlm, processor, trajectories, packed):
    batches = [trajectories] if packed else [[t] for t in trajectories]
    got = []
    with torch.no_grad():
        for batch in batches:
            lp = response_logprobs(vlm, build_batch(batch, [0.0] * len(batch), processor=processor))
            got += [lp[i, :len(t.response_ids)] for i, t in enumerate(batch)]
    for t, lp in zip(trajectories, got, strict=True):
        want = reference_logprobs(vlm, processor, t)
        assert (lp - want).abs().max() <= 1e-3, (t.trajectory_id, (lp - want).abs().max())
        assert (lp != 0).sum() == sum(t.response_mask)


def test_image_tokens_are_never_trained(processor, trajectories):
    pad = processor.image_token_id
    batch = build_batch(trajectories, [0.0] * len(trajectories), processor=processor)
    assert pad not in batch.targets.tolist()
    # One feature block per placeholder run; the figure that a and b share is encoded once (6 of 7 runs).
    assert int(batch.vision.image_grid_thw[batch.vision.runs].prod(-1).sum()) // 4 == int((batch.input_ids == pad).sum())
    assert len(batch.vision.runs) == 7 and len(batch.vision.image_grid_thw) == 6
    bad = trajectories[0].model_copy(update={"response_mask": [1] * len(trajectories[0].response_ids)})
    with pytest.raises(ValueError, match="trains an image token"):
        build_batch([bad], [0.0], processor=processor)


def test_images_are_processed_once_and_checked(processor, trajectories):
    cache: dict = {}
    build_batch(trajectories, [0.0] * len(trajectories), processor=processor, pixel_cache=cache)
    assert len(cache) == len({i.png for t in trajectories for i in t.images}) == 6
    wrong = trajectories[2].model_copy(update={"images": [trajectories[2].images[0].model_copy(
        update={"grid_thw": (1, 2, 2)})]})
    with pytest.raises(ValueError, match=r"^the trainer.s processor gives image grids \[\(1, \d+, \d+\)\], "
                                         r"the rollout recorded \[\(1, 2, 2\)\]"):
        build_batch([wrong], [0.0], processor=processor)
    with pytest.raises(ValueError, match="no processor"):
        build_batch(trajectories[:1], [0.0])


def test_images_after_the_last_trained_token_are_left_out(vlm, processor, trajectories):
    t = trajectories[0]
    # Without the answer, the tool result (with its image) follows the last trained token.
    cut = len(t.response_mask) - t.response_mask[::-1].index(0)
    assert t.response_ids[:cut].count(processor.image_token_id) > 0
    short = t.model_copy(update={"response_ids": t.response_ids[:cut], "response_mask": t.response_mask[:cut],
                                 "logprobs": t.logprobs[:cut]})
    batch = build_batch([short], [0.0], processor=processor)
    assert batch.vision.per_sequence == [[0]] and batch.vision.runs == [0]
    with torch.no_grad():
        lp = response_logprobs(vlm, batch)[0, :len(short.response_ids)]
    want = reference_logprobs(vlm, processor, t)[:len(short.response_ids)]
    assert (lp - want * torch.tensor(short.response_mask)).abs().max() <= 1e-3


def geo3k_group(processor) -> list[Trajectory]:
    """A geo3k group: 8 trajectories of one prompt with its figure and the same tool call; the tool
    results add crops (two of the same size but different pixels, so equal tokens, different images;
    one crop in three trajectories; one result without an image) and the answers differ."""
    figure, crops = image(100, 60), [image(40, 40, 1), image(40, 40, 6), image(30, 50, 3), image(40, 40, 1)]
    plan = [(crops[0], "x = 4"), (crops[0], "x = 5"), (crops[1], "x = 4"), (crops[2], "x is 12"),
            (None, "no"), (crops[3], "x = 7"), (crops[1], "x = 9"), (crops[2], "x = 4")]
    return [vision_trajectory(processor, f"g{i}", figure, crop, answer, group=0, reward=float(i % 3),
                              tool_image=crop is not None) for i, (crop, answer) in enumerate(plan)]


def vision_loss_and_grads(model, processor, trajs, share: bool, attn: str = "sdpa"):
    model.config._attn_implementation = attn
    return loss_and_grads(model, trajs, share, processor, max_len=128.0)


def assert_same_grads(want: dict, got: dict, rtol: float = 1e-6) -> None:
    """Each tower's gradient (its parameters' gradients as one vector) within ``rtol`` relative; each
    parameter's within ``10 × rtol``: the tree sums a shared row's gradients before the layers, the
    unshared row in them, and in fp32 that order leaves rounding of a few 1e-7 in parameters whose
    gradient is a sum that mostly cancels (the patch embedding's, some biases')."""
    for tower in (".visual.", ".language_model."):
        names = [n for n in want if tower in n]
        w, g = (torch.cat([grads[n].flatten() for n in names]) for grads in (want, got))
        assert names and float(w.norm()) > 0 and float((g - w).norm()) <= rtol * float(w.norm()), tower
    for name, w in want.items():
        assert float((got[name] - w).norm()) <= 10 * rtol * float(w.norm()) + 1e-12, name


def assert_same_step(want, got, rtol: float = 1e-6):
    _, want_lp, want_loss, want_grads = want
    _, got_lp, got_loss, got_grads = got
    assert torch.allclose(got_lp, want_lp, atol=1e-5, rtol=0)
    assert abs(float(got_loss - want_loss)) <= rtol * abs(float(want_loss))
    assert_same_grads(want_grads, got_grads, rtol)


def test_a_group_sharing_a_prompt_with_its_figure_holds_it_once(vlm, processor):
    """Shared prefixes with images: the figure's prompt once, each distinct image encoded once, and the
    unshared loss and gradients (both towers)."""
    trajs = geo3k_group(processor)
    unshared = vision_loss_and_grads(vlm, processor, trajs, share=False)
    shared = vision_loss_and_grads(vlm, processor, trajs, share=True)
    assert_same_step(unshared, shared)
    batch, pad = shared[0], processor.image_token_id
    assert batch.attention is not None and batch.total_tokens == unshared[0].tokens
    # The prompt and the call once; after them a node per distinct tool result (crop 0 ×3, crop 1 ×2,
    # crop 2 ×2, no image ×1): the equal-token crops 0 and 1 are not merged.
    prompt, call = len(trajs[0].prompt_ids), trajs[0].response_mask.index(0)
    assert batch.tokens < batch.total_tokens - 7 * (prompt + call)
    assert len(batch.vision.image_grid_thw) == 4 and sorted(batch.vision.runs) == [0, 1, 2, 3]
    assert int(batch.vision.image_grid_thw[batch.vision.runs].prod(-1).sum()) // 4 == int((batch.input_ids == pad).sum())
    # Without keying the runs by image, crops 0 and 1 (equal tokens) would share one node.
    raw = prefix_tree.layout([packing.input_tokens(t) for t in trajs])
    assert len(raw.ids) < batch.tokens


def test_tree_rows_with_images_are_the_unshared_rows_in_float64(vlm_path, processor):
    """In float64 the tree's hidden states at every token of every sequence are the unshared row's to
    the last bit (the rotary positions gathered from the sequences and the features scattered per run
    are exact), and a loss on them gives both towers the unshared gradients (to the float32 rounding of
    the norms' backward, which runs in float32)."""
    model = model_sources.load_model(vlm_path).double()
    trajs = geo3k_group(processor) + [vision_trajectory(processor, "q", image(100, 60, 5), image(40, 40, 1), "x = 4")]
    weight = torch.randn(model.config.text_config.hidden_size, dtype=torch.float64,
                         generator=torch.Generator().manual_seed(0))

    def run(share):
        batch = build_batch(trajs, [0.0] * len(trajs), share_prefixes=share, processor=processor)
        model.zero_grad(set_to_none=True)
        hidden = packing.packed_hidden_states(model, batch)
        (torch.tanh(hidden[batch.head_pos] @ weight) * torch.arange(len(batch.head_pos)).sin()).sum().backward()
        rows = hidden.detach() if batch.expand is None else hidden.detach()[batch.expand]
        return batch, rows, {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}

    (unshared, want, want_grads), (tree, got, got_grads) = run(False), run(True)
    assert tree.attention is not None and tree.tokens < tree.total_tokens == unshared.tokens
    assert float((got - want).abs().max()) <= 1e-12
    assert want_grads.keys() == got_grads.keys()
    assert_same_grads(want_grads, got_grads)


def test_equal_tokens_with_different_figures_share_nothing_after_them(vlm, processor):
    """Two prompts that differ only in their figure's pixels: the tree splits where the figures begin."""
    trajs = [vision_trajectory(processor, "p", image(100, 60), image(40, 40, 1), "x = 4"),
             vision_trajectory(processor, "q", image(100, 60, 5), image(40, 40, 1), "x = 4")]
    assert trajs[0].prompt_ids == trajs[1].prompt_ids
    first = trajs[0].prompt_ids.index(processor.image_token_id)
    unshared = vision_loss_and_grads(vlm, processor, trajs, share=False)
    shared = vision_loss_and_grads(vlm, processor, trajs, share=True)
    assert_same_step(unshared, shared)
    min_shared = prefix_tree.MIN_SHARED_TOKENS
    expect = first if first >= min_shared else 0
    assert shared[0].tokens == shared[0].total_tokens - expect
    assert len(shared[0].vision.image_grid_thw) == 3 and len(shared[0].vision.runs) == 4


@pytest.mark.parametrize("attn", ["eager", "test_kernel"])
def test_images_under_other_attention(vlm, processor, caplog, monkeypatch, unknown_kernel, attn):
    """Eager attention takes the tree as one dense mask; a kernel toolrl does not know runs the unshared
    row, said once. Both give the unshared step."""
    packing._warn_unshared.cache_clear()
    trajs = geo3k_group(processor)[:4]
    want = vision_loss_and_grads(vlm, processor, trajs, share=False, attn="eager")
    with caplog.at_level(logging.WARNING, logger="toolrl.training.packing"):
        got = vision_loss_and_grads(vlm, processor, trajs, share=True, attn=attn)
    assert got[0].attention is not None
    assert sum("cannot take a prefix-shared" in r.getMessage() for r in caplog.records) == (attn == "test_kernel")
    # A shared row's hidden state is read from its first copy only: the same gradients up to rounding.
    assert_same_step(want, got, rtol=1e-5)


@pytest.mark.parametrize("budget", [120, 200])
def test_token_budget_micro_batches_with_images_give_the_unshared_gradients(vlm, processor, budget):
    """The trees' token-budget plan (shared tokens counted once, trees cut between continuations), each
    micro-batch's loss and gradients accumulated, against the same micro-batches packed unshared."""
    from toolrl.config import AlgorithmConfig
    from toolrl.training.step import policy_loss

    trajs = geo3k_group(processor) + [vision_trajectory(processor, "o", image(60, 90, 2), image(50, 30, 5), "x = 1")]
    lengths = [input_length(t) for t in trajs]
    [steps] = plan(list(range(len(trajs))), lengths, 1, 8, budget, packing.tree_keys(trajs, processor))
    assert len(steps) > 1 and any(len(m) > 1 for m in steps)

    def run(share):
        vlm.zero_grad(set_to_none=True)
        total, computed = 0.0, 0
        for micro in steps:
            batch = build_batch([trajs[i] for i in micro], [0.5 - 0.2 * i for i in micro], share_prefixes=share,
                                processor=processor)
            assert not share or batch.tokens <= budget
            computed += batch.tokens
            lp = response_logprobs(vlm, batch, chunk_size=7)
            norm = {"tokens": float(sum(sum(t.response_mask) for t in trajs)), "seqs": 9.0, "max_len": 128.0}
            loss, _ = policy_loss(lp, lp.detach() + 0.01, batch, AlgorithmConfig(tis_cap=2.0), norm)
            loss.backward()
            total += float(loss.detach())
        return total, computed, {n: p.grad.clone() for n, p in vlm.named_parameters()}

    (want, unshared_tokens, want_grads), (got, tree_tokens, got_grads) = run(False), run(True)
    assert tree_tokens < unshared_tokens == sum(lengths)
    assert abs(got - want) <= 1e-6 * abs(want)
    assert_same_grads(want_grads, got_grads)


@pytest.mark.parametrize("optim", [{"max_tokens_per_micro_batch": 260}, {"micro_batch_size": 3}])
def test_grpo_step_with_images_and_shared_prefixes(vlm_path, processor, optim):
    """A GRPO step with images and shared prefixes trains like today's packing. Within 1e-5, not 1e-6:
    a group's advantages sum to zero, so its shared prompt's gradient is a sum that mostly cancels, and
    the float32 rounding of the two summation orders (tree: before the layers; unshared: in them) is
    a few 1e-6 of what remains (the exact agreement is the float64 test's)."""
    import copy

    from test_microbatch import Recorder

    trajs = geo3k_group(processor) + [vision_trajectory(processor, "o", image(60, 90, 2), image(50, 30, 5), "x = 1",
                                                        group=1, reward=1.0)]
    model = model_sources.load_model(vlm_path)
    names = [n for n, _ in model.named_parameters()]

    def step(share):
        m = copy.deepcopy(model)
        opt = Recorder(m.parameters())
        out = train_step(m, opt, copy.deepcopy(trajs), options(processor, share_prefixes=share, grad_clip=1e9, **optim))
        assert len(opt.grads) == 1
        return out, dict(zip(names, opt.grads[0], strict=True))

    (want, want_grads), (got, got_grads) = step(False), step(True)
    assert want["prefix_share"] == 0 and got["prefix_share"] > 0.3
    assert got["trainer_tokens_total"] == want["trainer_tokens_total"]
    assert abs(got["loss"] - want["loss"]) <= 1e-5 * abs(want["loss"])
    assert_same_grads(want_grads, got_grads, 1e-5)


def test_micro_batches_count_image_tokens(processor, trajectories):
    lengths = [input_length(t) for t in trajectories]
    images = [(t.prompt_ids + t.response_ids).count(processor.image_token_id) for t in trajectories]
    assert all(n >= i > 0 for n, i in zip(lengths, images, strict=True))
    budget = max(lengths)
    micro = plan(list(range(4)), lengths, 1, 8, budget)[0]
    assert all(sum(lengths[i] for i in m) <= budget for m in micro) and len(micro) > 1


def options(processor, **kw) -> StepOptions:
    cfg = load_config(TINY)
    return StepOptions(cfg.algorithm, cfg.optim.model_copy(update={"lr": 1e-3, **kw}), pad_id=0, temperature=1.0,
                       max_response_tokens=128, processor=processor)


def test_grpo_step_trains_language_and_vision(vlm, processor, trajectories):
    opt = torch.optim.AdamW(vlm.parameters(), lr=1e-3)
    before = {n: p.detach().clone() for n, p in vlm.named_parameters()}
    out = train_step(vlm, opt, trajectories, options(processor))
    assert out["grad_norm"] > 0 and out["trained_tokens"] == sum(sum(t.response_mask) for t in trajectories)
    moved = {n for n, p in vlm.named_parameters() if not torch.equal(p, before[n])}
    assert any(".visual." in n for n in moved) and any(".language_model." in n for n in moved)


def test_frozen_vision_tower(vlm_path, processor, trajectories):
    from toolrl.training.policy import build_policy

    cfg = load_config(TINY, ["model.source=tiny-qwen2.5-vl", "model.freeze_vision=true"])
    model = build_policy(cfg, vlm_path, "cpu")
    opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-3)
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    assert train_step(model, opt, trajectories, options(processor))["grad_norm"] > 0
    moved = {n for n, p in model.named_parameters() if not torch.equal(p, before[n])}
    assert moved and not any(".visual." in n for n in moved)
    with pytest.raises(ConfigError, match="no vision tower"):
        build_policy(load_config(TINY, ["model.freeze_vision=true"]), model_sources.tiny_qwen3(), "cpu")


def test_lora_adapts_the_language_model_only(vlm_path, processor, trajectories):
    from toolrl.modeling.adapters import lora_layers
    from toolrl.training import lora
    from toolrl.training.policy import build_policy

    cfg = load_config(TINY, ["model.source=tiny-qwen2.5-vl", "model.lora={r: 4, alpha: 8}"])
    model = build_policy(cfg, vlm_path, "cpu")
    layers = lora_layers(model)
    assert layers and all(".language_model." in n for n in layers)
    opt = torch.optim.AdamW(lora.trainable_parameters(model), lr=1e-2)
    assert train_step(Policy(model), opt, trajectories, options(processor))["grad_norm"] > 0
    merged = lora.engine_state_dict(model)
    assert set(merged) == set(model_sources.load_model(vlm_path).state_dict())


def rank_config(out: Path, world_size: int, *extra: str) -> Config:
    return load_config(TINY, [f"trainer.output_dir={out}", f"trainer.world_size={world_size}",
                              "model.source=tiny-qwen2.5-vl", "optim.lr=1e-3", "optim.micro_batch_size=2",
                              "rollout.max_response_tokens=128", "trainer.progress=false", *extra])


@pytest.mark.slow  # two trainer set-ups and an export: ~40 s
# Frozen, the round trip is the second test of what [False] (the round trip) and test_frozen_vision_tower (no
# vision weight moves) cover: in the long session.
@pytest.mark.parametrize("frozen", [False, pytest.param(True, marks=pytest.mark.long)])
def test_checkpoint_and_export_round_trip(processor, trajectories, tmp_path, frozen):
    from toolrl.processes.trainer_rank import TrainerRank
    from toolrl.run_dir import HF_FILES
    from toolrl.training.export import export, save_model_files
    from transformers import AutoModelForImageTextToText

    cfg = rank_config(tmp_path / "run", 1, f"model.freeze_vision={str(frozen).lower()}")
    rank = TrainerRank(cfg)
    rank.setup()
    assert rank.processor is not None
    assert rank.step(trajectories)["grad_norm"] > 0
    ckpt = tmp_path / "run" / "checkpoints"
    rank.save(str(ckpt / "step_000001"))
    (ckpt / "step_000001" / "meta.json").write_text(json.dumps({"step": 1}))
    save_model_files(model_sources.tiny_qwen2_5_vl(), ckpt / HF_FILES)
    (tmp_path / "run" / "config.json").write_text(cfg.model_dump_json())
    out = export(tmp_path / "run", tmp_path / "export")
    loaded = AutoModelForImageTextToText.from_pretrained(str(out))
    trained = rank.model.state_dict()
    assert all(torch.equal(v, trained[k]) for k, v in loaded.state_dict().items())
    again = model_sources.load_processor(out)
    assert again.image_processor.size == processor.image_processor.size
    # The exported model gives the trained model's log-probs.
    batch = build_batch(trajectories, [0.0] * 4, processor=again)
    with torch.no_grad():
        assert torch.equal(response_logprobs(loaded.eval(), batch), response_logprobs(rank.model.eval(), batch))
    # Resume: a fresh rank that loads the checkpoint holds the same weights.
    other = TrainerRank(cfg)
    other.setup()
    other.load(str(ckpt / "step_000001"))
    assert all(torch.equal(v, trained[k]) for k, v in other.model.state_dict().items())


async def engine_trajectory(engine, renderer, name: str, seeds: tuple[int, int], seed: int) -> Trajectory:
    """A two-turn trajectory sampled by the transformers engine: a prompt with a figure, a sampled
    turn, a tool result with a second image, a second sampled turn; the engine's own log-probs."""
    from toolrl.engines import SamplingParams
    from toolrl.trajectory import TrajectoryImage

    def img(s: int, size: tuple[int, int]) -> TrajectoryImage:
        from vision_fixtures import png

        data = png(image(*size, seed=s))
        return TrajectoryImage(png=data, grid_thw=renderer.image_grid(data))

    a, b = img(seeds[0], (100, 60)), img(seeds[1], (40, 70))
    sampling = SamplingParams(temperature=1.0, max_new_tokens=12, seed=seed)
    messages = [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": "Find x."}]}]
    first = renderer.prompt_ids(messages, [a.grid_thw])
    [gen] = await engine.generate(first, sampling, session_id=name, images=[a])
    tool = {"role": "user", "content": [{"type": "image"}, {"type": "text", "text": "the crop"}]}
    delta = renderer.tool_delta([tool], [b.grid_thw])
    [gen2] = await engine.generate(first + gen.token_ids + delta, sampling, session_id=name, images=[a, b])
    response = gen.token_ids + delta + gen2.token_ids
    return Trajectory(trajectory_id=name, sample_index=0, group=0, prompt_ids=first, images=[a, b],
                      response_ids=response, response_mask=[1] * len(gen.token_ids) + [0] * len(delta) +
                      [1] * len(gen2.token_ids), logprobs=gen.logprobs + [0.0] * len(delta) + gen2.logprobs)


@pytest.mark.parametrize("packed", [True, False])
async def test_trainer_logprobs_match_the_engines(vlm_path, processor, packed):
    from toolrl.engines import ModelSource
    from toolrl.engines.transformers import TransformersEngine
    from toolrl.renderers.chat import ChatRenderer

    model = model_sources.load_model(vlm_path)
    renderer = ChatRenderer(processor.tokenizer, chat_template=processor.chat_template, processor=processor)
    engine = TransformersEngine.create(ModelSource(path=vlm_path, module=model, tokenizer=processor.tokenizer),
                                       {"device": "cpu"})
    try:
        trajs = [await engine_trajectory(engine, renderer, f"t{i}", (2 * i, 2 * i + 1), i) for i in range(3)]
    finally:
        await engine.close()
    batches = [trajs] if packed else [[t] for t in trajs]
    with torch.no_grad():
        for batch in batches:
            lp = response_logprobs(model, build_batch(batch, [0.0] * len(batch), processor=processor))
            for i, t in enumerate(batch):
                mask = torch.tensor(t.response_mask, dtype=torch.float32)
                got, want = lp[i, :len(t.response_ids)], torch.tensor(t.logprobs) * mask
                assert int(mask.sum()) > len(t.response_ids) // 4
                assert (got - want).abs().max() <= 1e-3, (t.trajectory_id, (got - want).abs().max())


def test_critic_values_see_the_images(vlm, processor, trajectories):
    import copy

    from toolrl.training.critic import CriticOptions, ValueModel, batch_values

    critic = ValueModel.from_causal_lm(copy.deepcopy(vlm))
    torch.nn.init.normal_(critic.head.weight)  # the head starts at zero: every value would be 0
    with pytest.raises(ValueError, match="no processor"):
        batch_values(critic, trajectories, CriticOptions())
    options = CriticOptions(processor=processor)
    values = batch_values(critic, trajectories, options)
    assert torch.isfinite(values).all() and values.abs().sum() > 0
    # Another figure of the same size changes the values after it.
    from vision_fixtures import png

    other = trajectories[2].images[0].model_copy(update={"png": png(image(60, 90, 9))})
    changed = trajectories[2].model_copy(update={"images": [other]})
    again = batch_values(critic, [changed], options)[0]
    assert not torch.allclose(again, values[2, :again.shape[0]])
