"""The store a linked transport's peers meet at: a ``torch.distributed.TCPStore`` the sender hosts on a
free port of its node, joined by the receivers; its timeout bounds every wait on it."""

from __future__ import annotations

import sys
from datetime import timedelta
from typing import Any

from toolrl.transports import Link


def node_address() -> str:
    """This node's address as other processes reach it (Ray's view of the node when Ray is up)."""
    ray = sys.modules.get("ray")  # without Ray, peers are processes of this node (a hostname lookup can take seconds)
    return ray.util.get_node_ip_address() if ray is not None and ray.is_initialized() else "127.0.0.1"


def host_store(key: str, sender: int, receivers: int, timeout_s: float) -> tuple[Any, Link]:
    """A store for ``receivers + 1`` peers on a free port, and the link it is the address ("host:port") of."""
    import torch.distributed as dist

    host = node_address()
    store = dist.TCPStore(host, 0, receivers + 1, is_master=True, wait_for_workers=False,
                          timeout=timedelta(seconds=timeout_s))
    address = f"{host}:{store.port}"
    return store, Link(key=key, sender=sender, receivers=receivers, address=address, timeout_s=timeout_s)


def join_store(link: Link) -> Any:
    """The sender's store of ``link``; TransportError when it cannot be reached within the timeout."""
    import torch.distributed as dist

    host, _, port = link.address.rpartition(":")
    try:
        return dist.TCPStore(host, int(port), link.receivers + 1, is_master=False, wait_for_workers=False,
                             timeout=timedelta(seconds=link.timeout_s))
    except (RuntimeError, ValueError) as exc:  # DistStoreError is a RuntimeError
        raise link.error(f"cannot reach the sender at {link.address}: {exc}") from None
