"""The weight-transport contract, checked on any :class:`~toolrl.transports.LinkedTransport`.

:func:`check_weight_transport` raises AssertionError naming what broke: two senders stream the rows they
own of mixed weights (dtypes, a 0-d tensor, one larger than a bucket) to ``receivers`` receivers, three
rounds over the same links, byte-exact; and a receiver or a sender (a child process, so the transport must
pickle) that dies mid-transfer ends the other side's call within ``timeout_s``: no hang.

    from toolrl.testing.transports import check_weight_transport
    check_weight_transport(MyTransport(MyTransport.Options(...)))
"""

from __future__ import annotations

import contextlib
import functools
import multiprocessing
import os
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from multiprocessing.connection import Connection
from typing import Any

from toolrl.transports import ALIGN, Bucket, BucketHeader, LinkedTransport, RowPiece, TransportError

GRACE_S = 5.0  # beyond the link's timeout: process start-up and scheduling on a loaded machine


def _weights(seed: int) -> dict[str, Any]:
    import torch

    g = torch.Generator().manual_seed(seed)
    return {
        "embed": torch.randn(37, 16, generator=g),
        "norm": torch.randn(16, generator=g).to(torch.bfloat16),
        "steps": torch.randint(0, 1 << 40, (5, 3), generator=g),
        "scale": torch.tensor(float(seed) + 0.5),
        "big": torch.randn(300, 20, generator=g),  # larger than a bucket: travels alone
    }


def _buckets(weights: dict[str, Any], sender: int, senders: int, bucket_bytes: int) -> Iterator[Bucket]:
    """Sender ``sender``'s rows (a contiguous block of each tensor's dim 0) in packed buckets."""
    pieces: list[RowPiece] = []
    rows: list[Any] = []
    size = 0

    def bucket() -> Bucket:
        held = list(zip(pieces, rows, strict=True))

        def fill(buffer: Any) -> None:
            import torch

            for piece, t in held:
                buffer[piece.offset:piece.offset + piece.nbytes].copy_(t.contiguous().reshape(-1).view(torch.uint8))

        return Bucket(BucketHeader(pieces=list(pieces), nbytes=size), fill)

    for name, t in weights.items():
        n = t.shape[0] if t.dim() else 1
        per = -(-n // senders)
        start, stop = min(sender * per, n), min((sender + 1) * per, n)
        if stop <= start:
            continue
        part = t if not t.dim() else t[start:stop]
        nbytes = part.numel() * part.element_size()
        if pieces and size + nbytes > bucket_bytes:
            yield bucket()
            pieces, rows, size = [], [], 0
        pieces.append(RowPiece(name=name, shape=tuple(t.shape), dtype=str(t.dtype).removeprefix("torch."), start=start,
                            rows=stop - start, offset=size, nbytes=nbytes))
        rows.append(part)
        size = -(-(size + nbytes) // ALIGN) * ALIGN
    if pieces:
        yield bucket()


def _assembler(into: dict[str, Any], lock: threading.Lock) -> Callable[[BucketHeader, Any], None]:
    def load(header: BucketHeader, data: Any) -> None:
        import torch

        for piece in header.pieces:
            rows = piece.view(data)
            with lock:
                if piece.name not in into:
                    into[piece.name] = torch.zeros(piece.shape, dtype=rows.dtype)
                target = into[piece.name]
                (target if target.dim() == 0 else target.narrow(0, piece.start, piece.rows)).copy_(rows)

    return load


def _run(threads: list[threading.Thread], errors: list[BaseException], timeout_s: float, what: str) -> None:
    for t in threads:
        t.start()
    deadline = time.monotonic() + timeout_s
    for t in threads:
        t.join(max(0.0, deadline - time.monotonic()))
    assert not any(t.is_alive() for t in threads), f"{what}: still running after {timeout_s:g} s (a hang)"
    if errors:
        raise AssertionError(f"{what}: {type(errors[0]).__name__}: {errors[0]}") from errors[0]


def _round(senders: list[Any], ends: list[list[Any]], weights: dict[str, Any], timeout_s: float, what: str) -> None:
    import torch

    got: list[dict[str, Any]] = [{} for _ in ends]
    locks = [threading.Lock() for _ in ends]
    errors: list[BaseException] = []

    def guarded(fn: Callable[[], Any]) -> threading.Thread:
        def run() -> None:
            try:
                fn()
            except BaseException as exc:  # reported by _run
                errors.append(exc)
        return threading.Thread(target=run)

    threads = [guarded(functools.partial(sender.send, _buckets(weights, s, len(senders), 2048)))
               for s, sender in enumerate(senders)]
    threads += [guarded(functools.partial(end.receive, _assembler(got[i], locks[i])))
                for i, row in enumerate(ends) for end in row]
    _run(threads, errors, timeout_s * 2, what)
    for i in range(len(ends)):
        assert set(got[i]) == set(weights), f"{what}: receiver {i} got {sorted(got[i])}, sent {sorted(weights)}"
        for name, t in weights.items():
            assert got[i][name].dtype == t.dtype and torch.equal(got[i][name], t), \
                f"{what}: receiver {i} got {name!r} with other bytes than were sent"


def check_exact(transport: LinkedTransport, receivers: int = 2, timeout_s: float = 30.0, rounds: int = 3) -> None:
    """Two senders to ``receivers`` receivers, ``rounds`` times over the same links: every byte arrives."""

    senders = [transport.open_sender(f"check-{uuid.uuid4().hex[:8]}-{s}", s, receivers, timeout_s) for s in range(2)]
    ends = [[transport.open_receiver(s.link, i) for s in senders] for i in range(receivers)]
    try:
        for r in range(rounds):
            _round(senders, ends, _weights(r), timeout_s, f"{type(transport).__name__} round {r + 1}")
    finally:
        for end in [e for row in ends for e in row] + senders:
            end.close()


def _dying_receiver(transport: LinkedTransport, ready: Connection, links: Connection) -> None:
    def load(header: BucketHeader, data: Any) -> None:
        os._exit(3)  # dies mid-transfer, holding the link

    import torch  # noqa: F401  (imported before saying ready: the send is timed, not the start-up)

    ready.send(True)
    transport.open_receiver(links.recv(), 0).receive(load)


def _dying_sender(transport: LinkedTransport, key: str, links: Connection) -> None:
    sender = transport.open_sender(key, 0, 1, 60.0)
    links.send(sender.link)  # in the pipe when send returns: os._exit below cannot lose it

    def stream() -> Iterator[Bucket]:
        yield from _buckets(_weights(0), 0, 1, 512)
        os._exit(3)  # never ends its stream: dies with buckets sent

    sender.send(stream())


def _in_environment(environ: dict[str, str], target: Callable[..., None], *args: Any) -> None:
    # A forkserver's child has the server's environment, from whenever it started: this process's
    # now (RAY_ADDRESS set for the check, say) is what a spawned child would have had.
    os.environ.clear()
    os.environ.update(environ)
    target(*args)


@contextlib.contextmanager
def _child(ctx: Any, target: Callable[..., None], *args: Any) -> Iterator[Any]:
    """``target(*args)`` in a child process, killed on leaving. The child's pipe ends among ``args``
    are closed here once it has them, so that a child that dies unheard reads as EOF, not as silence."""
    child = ctx.Process(target=_in_environment, args=(dict(os.environ), target, *args), daemon=True)
    child.start()
    for end in args:
        if isinstance(end, Connection):
            end.close()
    try:
        yield child
    finally:
        child.kill()
        child.join(GRACE_S)


def _take(end: Connection, child: Any, timeout_s: float, what: str) -> Any:
    """What ``child`` sends on ``end`` within ``timeout_s``; AssertionError if it ends or waits without."""
    if not end.poll(timeout_s):
        raise AssertionError(f"no {what} from the child process within {timeout_s:g} s")
    try:
        return end.recv()
    except EOFError:
        child.join(GRACE_S)
        raise AssertionError(f"the child process ended (exit code {child.exitcode}) before sending its {what}") from None


# Each half hands its link over a pipe of its own, written synchronously: a multiprocessing.Queue is
# written by a feeder thread that the dying sender's os._exit does not wait for, and its get holds a
# lock shared between processes, which a receiver killed while waiting for its link never releases
# (the disk transport's send does not wait for its receivers, so the kill can come that early).

def _check_dead_receiver(transport: LinkedTransport, ctx: Any, timeout_s: float) -> None:
    (ready, ready_in), (links_out, links) = ctx.Pipe(duplex=False), ctx.Pipe(duplex=False)
    with _child(ctx, _dying_receiver, transport, ready_in, links_out) as child:
        _take(ready, child, 120, "ready signal")
        sender = transport.open_sender(f"dead-{uuid.uuid4().hex[:8]}", 0, 1, timeout_s)
        links.send(sender.link)
        weights = _weights(0)  # imports torch before the clock starts, like the child: the send is timed
        t0 = time.monotonic()
        with contextlib.suppress(TransportError):
            sender.send(_buckets(weights, 0, 1, 512))
        took = time.monotonic() - t0
        sender.close()
        assert took < timeout_s + GRACE_S, f"a send to a receiver that died mid-transfer took {took:.1f} s"


def _check_dead_sender(transport: LinkedTransport, ctx: Any, timeout_s: float) -> None:
    links, links_in = ctx.Pipe(duplex=False)
    with _child(ctx, _dying_sender, transport, f"dead-{uuid.uuid4().hex[:8]}", links_in) as child:
        link = _take(links, child, 120, "link")
        receiver = transport.open_receiver(link.model_copy(update={"timeout_s": timeout_s}), 0)
        t0 = time.monotonic()
        try:
            receiver.receive(lambda header, data: None)
        except TransportError:
            took = time.monotonic() - t0
        else:
            raise AssertionError("a receive from a sender that died ended without an error")
        receiver.close()
        assert took < timeout_s + GRACE_S, f"a receive from a sender that died took {took:.1f} s to fail"


def check_dead_peers(transport: LinkedTransport, timeout_s: float = 5.0) -> None:
    """A receiver that dies mid-transfer ends the send, a sender that dies ends the receive, each
    within ``timeout_s`` (+ :data:`GRACE_S`)."""
    # Children forked from a server that imported torch once: each spawned child imported it afresh,
    # a second or more of CPU apiece (most of the check's cost). Where the caller started the server
    # already, children import it themselves.
    ctx = multiprocessing.get_context("forkserver")
    ctx.set_forkserver_preload(["torch"])
    _check_dead_receiver(transport, ctx, timeout_s)
    _check_dead_sender(transport, ctx, timeout_s)


def check_weight_transport(transport: LinkedTransport, receivers: int = 2, timeout_s: float = 5.0) -> None:
    """Every check of this module on ``transport`` (see the module's docstring)."""
    assert isinstance(transport, LinkedTransport), f"{transport!r} is not a toolrl.transports.LinkedTransport"
    check_exact(transport, receivers)
    check_dead_peers(transport, timeout_s)
