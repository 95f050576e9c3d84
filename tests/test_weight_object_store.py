"""The ``object_store`` weight transport (:mod:`toolrl.transports.object_store`) on a local Ray: the
transport contract, and the same equality tests as every other transport's (test_weight_transport*.py:
engines after a sync over it equal the exported checkpoint bit for bit; a live engine's weights to a new
one; delta; LoRA adapters only)."""

from __future__ import annotations

import os

import pytest
import test_weight_transport as plain
import test_weight_transport_delta as delta
import test_weight_transport_lora as lora
from test_weight_transport import trained  # noqa: F401  (a fixture)
from test_weight_transport_lora import adapted  # noqa: F401  (a fixture)
from toolrl.testing.transports import check_dead_peers, check_exact
from toolrl.transports.object_store import ObjectStoreTransport


@pytest.fixture(scope="module", autouse=True)
def ray_cluster():
    """A local Ray this process drives; the checks' child processes join it (``RAY_ADDRESS``)."""
    import ray
    from toolrl.ray_cluster import init_ray  # a busy machine's slow start gets a second try

    init_ray("local", 2, num_cpus=2, log_to_driver=False)
    before = os.environ.get("RAY_ADDRESS")
    os.environ["RAY_ADDRESS"] = ray.get_runtime_context().gcs_address
    try:
        yield
    finally:
        if before is None:
            os.environ.pop("RAY_ADDRESS", None)
        else:
            os.environ["RAY_ADDRESS"] = before
        ray.shutdown()


def test_conformance_every_byte_arrives():
    check_exact(ObjectStoreTransport())


def test_a_link_opens_with_its_mailbox_running():
    """open_sender returns once the mailbox actor runs, so a send's timeout counts the transfer, not the
    start of the actor's process (a send to a dead receiver took 10.6 s against 1 s when it did not)."""
    import ray._private.state

    sender = ObjectStoreTransport().open_sender("opened", 0, 1, 1.0)
    try:
        assert ray._private.state.actors(actor_id=sender.mailbox._actor_id.hex())["State"] == "ALIVE"
    finally:
        sender.close()


@pytest.mark.slow  # child processes start torch and join Ray: seconds each on a loaded machine
def test_conformance_a_dead_peer_ends_the_transfer_within_the_timeout():
    check_dead_peers(ObjectStoreTransport(), timeout_s=1.0)


@pytest.mark.parametrize("load", ["in_place", "staged"])
async def test_engines_after_a_sync_equal_the_exported_checkpoint(load, trained, tiny_qwen3_path, tmp_path):  # noqa: F811
    await plain.test_engines_after_a_sync_equal_the_exported_checkpoint("object_store", load, trained,
                                                                        tiny_qwen3_path, tmp_path)


async def test_a_live_engine_sends_its_weights_to_a_new_one_bit_for_bit(trained, tiny_qwen3_path, tmp_path):  # noqa: F811
    await plain.test_a_live_engine_sends_its_weights_to_a_new_one_bit_for_bit("object_store", trained,
                                                                              tiny_qwen3_path, tmp_path)


async def test_delta_sends_only_what_changed_and_equals_a_full_sync(tiny_qwen3_path, tmp_path):
    await delta.test_delta_sends_only_what_changed_and_equals_a_full_sync("object_store", tiny_qwen3_path, tmp_path)


async def test_adapter_only_sync_equals_the_merged_weights_and_sends_only_the_adapters(adapted, tiny_qwen3_path,  # noqa: F811
                                                                                        tmp_path):
    await lora.test_adapter_only_sync_equals_the_merged_weights_and_sends_only_the_adapters(
        "object_store", adapted, tiny_qwen3_path, tmp_path)
