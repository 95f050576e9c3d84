"""Weight transports (toolrl.transports): the kind, the conformance check on every built-in, and engines
after a sync over each equal, bit for bit, an engine loaded from the exported checkpoint of the same
weights."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import threading
from pathlib import Path

import pytest
import torch
from toolrl.config import ConfigError, TrainerConfig
from toolrl.engines import ModelSource, RolloutEngine, SamplingParams
from toolrl.engines.transformers import TransformersEngine
from toolrl.model_sources import load_model
from toolrl.testing.transports import check_dead_peers, check_exact
from toolrl.training.weight_sync import SyncStats, owned_buckets, send_engine_weights, send_owned
from toolrl.transports import Link, LinkedTransport, TransportError, build_transport
from toolrl.transports.disk import DiskSender, DiskTransport
from toolrl.transports.object_store import ObjectStoreTransport
from toolrl.transports.shared_memory import SEGMENT_PREFIX
from toolrl.transports.weight_rows import receive_into

# The transports tested in this process without Ray; object_store's tests (on a local Ray) call the
# same ones: test_weight_object_store.py.
LINKED = ("broadcast", "shared_memory", "disk")


def transport(name: str, tmp_path: Path) -> LinkedTransport:
    # Files under the test's directory: a sender the dead-peer check kills leaves its segments behind.
    options = {"disk": {"path": str(tmp_path / "weights")}, "shared_memory": {"directory": str(tmp_path)}}.get(name, {})
    built = build_transport(TrainerConfig(weight_transport=name, weight_transport_options=options))
    assert isinstance(built, LinkedTransport)
    return built


def test_a_transfer_error_names_its_link(tmp_path: Path) -> None:
    link = Link(key="k7", sender=0, receivers=1, address=str(tmp_path), timeout_s=0.05)
    with pytest.raises(TransportError, match=r"^weight link k7: no bucket 0 in .* within 0.05 s$"):
        transport("disk", tmp_path).open_receiver(link, 0).receive(lambda header, data: None)


def test_object_store_is_the_default():
    assert isinstance(build_transport(TrainerConfig()), ObjectStoreTransport)


def test_an_unknown_transport_is_one_line_naming_the_field():
    with pytest.raises(ConfigError, match=r"trainer.weight_transport: .*'braodcast'.*did you mean 'broadcast'"):
        build_transport(TrainerConfig(weight_transport="braodcast"))


def test_bad_options_name_the_field():
    with pytest.raises(ConfigError, match=r"trainer.weight_transport_options.path"):
        build_transport(TrainerConfig(weight_transport="disk"))
    with pytest.raises(ConfigError, match=r"trainer.weight_transport_options.nope"):
        build_transport(TrainerConfig(weight_transport="broadcast", weight_transport_options={"nope": 1}))


@pytest.mark.parametrize("name", LINKED)
def test_conformance_every_byte_arrives(name, tmp_path):
    check_exact(transport(name, tmp_path))


@pytest.mark.slow  # child processes start torch: seconds each on a loaded machine
@pytest.mark.parametrize("name", LINKED)
def test_conformance_a_dead_peer_ends_the_transfer_within_the_timeout(name, tmp_path):
    check_dead_peers(transport(name, tmp_path), timeout_s=1.0)


class QuitSender(DiskSender):
    """Gives up as its send starts: in the test's process it returns having sent nothing, anywhere else
    (the check's dying sender) the process exits at once, the instant after it handed its link over."""

    def __init__(self, home: int, *args) -> None:
        super().__init__(*args)
        self.home = home

    def send(self, buckets) -> int:
        if os.getpid() != self.home:
            os._exit(3)
        return 0


class QuitTransport(DiskTransport):
    """disk with QuitSender: the dead-peer check then kills its receiver while that still waits for its
    link, and its sender exits right after handing its link over; both handovers must survive."""

    def __init__(self, options) -> None:
        super().__init__(options)
        self.home = os.getpid()

    def open_sender(self, key: str, sender: int, receivers: int, timeout_s: float) -> QuitSender:
        return QuitSender(self.home, key, sender, receivers, timeout_s, self.options.path)


@pytest.mark.slow  # two child processes start torch
def test_the_dead_peer_check_survives_peers_that_die_around_the_handover_of_their_link(tmp_path):
    """Its links once went through one multiprocessing.Queue: a receiver killed inside its get kept the
    queue's lock, and a sender's os._exit outran the queue's feeder thread; either left the dead-sender
    half waiting 120 s for a link."""
    check_dead_peers(QuitTransport(DiskTransport.Options(path=str(tmp_path))), timeout_s=1.0)


def test_a_killed_senders_segments_are_removed_by_the_next_sender(tmp_path):
    """A shared_memory sender killed outright cannot unlink its segments; the next one opened in the
    same directory removes those whose sender pid is gone, and leaves a live sender's alone."""
    gone = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    orphan = tmp_path / f"{SEGMENT_PREFIX}{int(gone.stdout)}-old-0"
    live = tmp_path / f"{SEGMENT_PREFIX}{os.getpid()}-other-0"
    for path in (orphan, live):
        path.write_bytes(b"\0" * 64)
    sender = transport("shared_memory", tmp_path).open_sender("new", 0, 1, 5.0)
    try:
        assert not orphan.exists() and live.exists()
    finally:
        sender.close()


# -- engines ----------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def trained(tiny_qwen3_path, tmp_path_factory):
    """A model one "step" away from the tiny checkpoint, and that step's exported checkpoint."""
    model = load_model(tiny_qwen3_path, dtype="float32", device="cpu")
    g = torch.Generator().manual_seed(7)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn(p.shape, generator=g) * 0.02)
    exported = tmp_path_factory.mktemp("exported")
    shutil.copytree(tiny_qwen3_path, exported, dirs_exist_ok=True)
    model.save_pretrained(exported)
    return model, str(exported)


async def logprobs(engine: RolloutEngine, prompts: list[list[int]]) -> list[tuple[list[int], list[float]]]:
    params = SamplingParams(temperature=1.0, max_new_tokens=8, seed=3)
    return [(g.token_ids, g.logprobs) for p in prompts for g in await engine.generate(p, params)]


PROMPTS = [[151644, 872, 198, 9707, 11, 1246, 525, 498, 30], [151644, 872, 198, 17, 10, 18, 28, 30, 151645]]


@pytest.mark.parametrize("name", LINKED)
@pytest.mark.parametrize("load", ["in_place", "staged"])
async def test_engines_after_a_sync_equal_the_exported_checkpoint(name, load, trained, tiny_qwen3_path, tmp_path):
    """Two senders (each its share of the tensors) to two engines holding the old weights; after the
    sync each samples the same tokens with the same log-probs, bit for bit, as an engine loaded from
    the exported checkpoint. ``staged``: the engine contract's default (assembled, then update_weights)."""
    model, exported = trained
    kind = transport(name, tmp_path)
    engines = [TransformersEngine.create(ModelSource(path=tiny_qwen3_path), {"device": "cpu"}) for _ in range(2)]
    if load == "staged":
        for e in engines:  # the base class's rows loading, not the engine's in-place override
            e.load_weight_rows = RolloutEngine.load_weight_rows.__get__(e)
            e.finish_weight_rows = RolloutEngine.finish_weight_rows.__get__(e)
    reference = TransformersEngine.create(ModelSource(path=exported), {"device": "cpu"})
    senders = [kind.open_sender(f"t-{name}-{load}-{r}", r, 2, 30.0) for r in range(2)]
    try:
        before = await logprobs(engines[0], PROMPTS)
        errors: list[BaseException] = []

        def run(fn):
            try:
                fn()
            except BaseException as exc:
                errors.append(exc)

        threads = [threading.Thread(target=run, args=(lambda r=r: send_owned(model, senders[r], r, 2, 0.05),))
                   for r in range(2)]
        threads += [threading.Thread(target=run, args=(lambda e=e, i=i: receive_into(
            e, [kind.open_receiver(s.link, i) for s in senders], 1),)) for i, e in enumerate(engines)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(120)
        assert not errors, errors
        want = await logprobs(reference, PROMPTS)
        assert before != want  # the sync had something to change
        for e in engines:
            assert e.weight_version == 1
            assert await logprobs(e, PROMPTS) == want
    finally:
        for s in senders:
            s.close()
        for e in [*engines, reference]:
            await e.close()


@pytest.mark.parametrize("name", LINKED)
async def test_a_live_engine_sends_its_weights_to_a_new_one_bit_for_bit(name, trained, tiny_qwen3_path, tmp_path):
    """A peer in place of the trainer: a live engine's weights (each tied tensor once) to a new engine."""
    _, exported = trained
    live = TransformersEngine.create(ModelSource(path=exported), {"device": "cpu"})
    new = TransformersEngine.create(ModelSource(path=tiny_qwen3_path), {"device": "cpu"})
    kind = transport(name, tmp_path)
    sender = kind.open_sender(f"peer-{name}", 0, 1, 30.0)
    sent: list[int] = []

    def send():
        with live.updating_weights(3):
            sent.append(send_engine_weights(live, sender, 0.05).bytes_sent)

    try:
        thread = threading.Thread(target=send)
        thread.start()
        received = receive_into(new, [kind.open_receiver(sender.link, 0)], 3)
        thread.join(60)
        mine, theirs = live.weight_tensors(), new.weight_tensors()
        assert mine.keys() == theirs.keys() and all(torch.equal(mine[k], theirs[k]) for k in mine)
        unique = {v.data_ptr(): v for v in mine.values()}
        assert sent == [sum(v.numel() * v.element_size() for v in unique.values())] and received >= sent[0]
        assert new.weight_version == 3 and await logprobs(new, PROMPTS) == await logprobs(live, PROMPTS)
    finally:
        sender.close()
        for e in (live, new):
            await e.close()


def test_buckets_cover_every_weight_once_split_between_ranks(trained):
    """Two ranks' buckets together hold every engine weight whole exactly once (tied ones once), none
    over the bucket size unless alone."""
    model, _ = trained
    seen: dict[str, int] = {}
    for rank in range(2):
        for bucket in owned_buckets(model, rank, 2, 1 << 16, SyncStats()):
            assert bucket.header.nbytes <= 1 << 16 or len(bucket.header.pieces) == 1
            for piece in bucket.header.pieces:
                seen[piece.name] = seen.get(piece.name, 0) + piece.rows
    names = {n for n, v in model.state_dict().items()}
    tied = {"lm_head.weight"} if model.config.tie_word_embeddings else set()
    assert set(seen) == names - tied
    assert all(rows == (model.state_dict()[n].shape[0] if model.state_dict()[n].dim() else 1) for n, rows in seen.items())
