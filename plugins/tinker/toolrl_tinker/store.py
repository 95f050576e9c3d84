"""What survives a restart, under the server's state directory: a SQLite file of training runs (with
the weights each base name stood for), checkpoints (with their expiry) and futures, and each
checkpoint's files: ``ckpt/<model_id>/<kind>/<name>.pt`` (:meth:`toolrl_tinker.trainer.Trainer.save`'s
dict: the adapter's tensors, ``base``, ``rank``, ``targets``, ``steps`` and the AdamW state or None), or
for ``external_weights`` a PEFT adapter directory ``ckpt/<model_id>/external_weights/<name>/``. A future the
file still holds as running when the server starts again was cut off by the restart: it is answered as failed.
"""

from __future__ import annotations

import json
import re
import shutil
import sqlite3
import threading
import time
from pathlib import Path
from typing import Any

from toolrl_tinker.requests import UserError

SCHEMA = """
create table if not exists runs (model_id text primary key, owner text, base text, rank integer,
    targets text, seed integer, created real, source text);
create table if not exists checkpoints (path text primary key, owner text, model_id text, kind text,
    name text, file text, size integer, created real, expires real);
create table if not exists futures (request_id text primary key, owner text, state text, error text);
"""
# Columns a state directory written before them lacks: added, empty, when the server starts on it.
ADDED = {"runs": ("source text",), "checkpoints": ("expires real",)}
RESTARTED = "the server restarted while this request ran; its result is lost (send it again)"
# A checkpoint's name is a file name under the state directory, and the last part of its tinker:// path.
NAME = re.compile(r"[A-Za-z0-9_][A-Za-z0-9._-]{0,127}")
RUN_KEYS = ("model_id", "owner", "base", "rank", "targets", "seed", "created", "source")
CHECKPOINT_KEYS = ("path", "owner", "model_id", "kind", "name", "file", "size", "created", "expires")


class Store:
    def __init__(self, root: Path, sources: dict[str, str] | None = None) -> None:
        """The state under ``root``; ``sources``: what each base name the server holds loads (recorded
        with each run, for ``toolrl tinker export``)."""
        self.root = root
        self.sources = dict(sources or {})
        root.mkdir(parents=True, exist_ok=True)
        self._lock = threading.Lock()
        self._db = sqlite3.connect(root / "state.sqlite", check_same_thread=False, isolation_level=None)
        # Every request writes its future's start and end, on the event loop: with a write-ahead log synced
        # only at its checkpoints, no write waits for the disk (a synced rollback journal made each request
        # wait for two disk syncs, and every other request with it). A killed server loses nothing; a power
        # cut may lose the last writes, never the file.
        self._db.execute("pragma journal_mode = wal")
        self._db.execute("pragma synchronous = normal")
        self._db.executescript(SCHEMA)
        for table, columns in ADDED.items():
            have = {row[1] for row in self._db.execute(f"pragma table_info({table})")}
            for column in columns:
                if column.split()[0] not in have:
                    self._db.execute(f"alter table {table} add column {column}")

    def restarted(self) -> None:
        """The server starts on this state: futures it recorded as running were cut off (not done by a
        command that reads or adds to the state beside a running server)."""
        self._run("update futures set state = 'failed', error = ? where state = 'running'", (RESTARTED,))

    def _run(self, sql: str, args: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
        with self._lock:
            return self._db.execute(sql, args).fetchall()

    def _rows(self, table: str, keys: tuple[str, ...], where: str, args: tuple[Any, ...]) -> list[dict[str, Any]]:
        return [dict(zip(keys, row, strict=True)) for row in self._run(f"select {', '.join(keys)} from {table} {where}", args)]

    # runs
    def add_run(self, model_id: str, owner: str, base: str, rank: int, targets: list[str], seed: int | None) -> None:
        self._run(f"insert into runs ({', '.join(RUN_KEYS)}) values (?, ?, ?, ?, ?, ?, ?, ?)",
                  (model_id, owner, base, rank, json.dumps(targets), seed, time.time(), self.sources.get(base)))

    def run(self, model_id: str) -> dict[str, Any] | None:
        """A run's record; ``source`` is what its base name loaded (None: the name itself, or a run made
        before sources were recorded)."""
        found = self._runs("where model_id = ?", (model_id,))
        return found[0] if found else None

    def runs(self, owner: str) -> list[dict[str, Any]]:
        return self._runs("where owner = ? order by created", (owner,))

    def _runs(self, where: str, args: tuple[Any, ...]) -> list[dict[str, Any]]:
        return [{**row, "targets": json.loads(row["targets"])} for row in self._rows("runs", RUN_KEYS, where, args)]

    # checkpoints
    def checkpoint_file(self, model_id: str, kind: str, name: str) -> Path:
        """Where checkpoint ``name`` of a run goes; a name that is not a plain file name is the client's error."""
        if not NAME.fullmatch(name):
            raise UserError(f"checkpoint name {name!r}: a name is 1 to 128 letters, digits, '.', '_' or '-', "
                            "not starting with '.' or '-'")
        path = self.root / "ckpt" / model_id / kind / f"{name}.pt"
        path.parent.mkdir(parents=True, exist_ok=True)
        return path

    def add_checkpoint(self, path: str, owner: str, model_id: str, kind: str, name: str, file: Path,
                       expires: float | None = None) -> None:
        self._run(f"insert or replace into checkpoints ({', '.join(CHECKPOINT_KEYS)}) "
                  "values (?, ?, ?, ?, ?, ?, ?, ?, ?)",
                  (path, owner, model_id, kind, name, str(file), size_on_disk(file), time.time(), expires))

    def checkpoint(self, path: str) -> dict[str, Any] | None:
        found = self._rows("checkpoints", CHECKPOINT_KEYS, "where path = ?", (path,))
        return found[0] if found else None

    def owned_checkpoint(self, owner: str, path: str) -> dict[str, Any]:
        """Checkpoint ``path``'s record; another owner's is answered as one that does not exist."""
        found = self.checkpoint(path)
        if found is None or found["owner"] != owner:
            raise UserError(f"checkpoint {path!r} does not exist")
        return found

    def set_expiry(self, path: str, expires: float | None) -> None:
        self._run("update checkpoints set expires = ? where path = ?", (expires, path))

    def expired(self, now: float) -> list[str]:
        return [r[0] for r in self._run("select path from checkpoints where expires <= ?", (now,))]

    def next_expiry(self) -> float | None:
        return self._run("select min(expires) from checkpoints")[0][0]

    def older_than_latest(self, model_id: str, kind: str, keep: int) -> list[str]:
        """Run ``model_id``'s checkpoints of ``kind`` but its latest ``keep``."""
        return [r[0] for r in self._run("select path from checkpoints where model_id = ? and kind = ? "
                                        "order by created desc, rowid desc limit -1 offset ?", (model_id, kind, keep))]

    def checkpoints(self, owner: str, model_id: str | None = None) -> list[dict[str, Any]]:
        return self._rows("checkpoints", CHECKPOINT_KEYS, "where owner = ? and (? is null or model_id = ?) order by "
                          "created", (owner, model_id, model_id))

    def checkpoint_totals(self) -> list[tuple[str, int, int]]:
        """Per owner: how many checkpoints, and their bytes."""
        return [(r[0], r[1], r[2] or 0) for r in self._run("select owner, count(*), sum(size) from checkpoints group by owner")]

    def delete_checkpoint(self, path: str) -> None:
        found = self.checkpoint(path)
        if found is not None:
            file = Path(found["file"])
            if file.is_dir():
                shutil.rmtree(file)
            else:
                file.unlink(missing_ok=True)
            self._run("delete from checkpoints where path = ?", (path,))

    # futures
    def future_started(self, request_id: str, owner: str) -> None:
        self._run("insert or replace into futures values (?, ?, 'running', null)", (request_id, owner))

    def future_ended(self, request_id: str) -> None:
        self._run("delete from futures where request_id = ?", (request_id,))

    def lost_future(self, request_id: str) -> tuple[str, str] | None:
        """(owner, error) of a future cut off by a restart, None for any other id."""
        rows = self._run("select owner, error from futures where request_id = ? and state = 'failed'", (request_id,))
        return (rows[0][0], rows[0][1]) if rows else None


def size_on_disk(file: Path) -> int:
    """A checkpoint's bytes: its file's, or its folder's files' (external weights)."""
    return sum(f.stat().st_size for f in file.iterdir()) if file.is_dir() else file.stat().st_size
