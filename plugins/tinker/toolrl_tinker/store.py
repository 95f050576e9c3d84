"""What survives a restart, under the server's state directory: a SQLite file of training runs,
checkpoints and futures, and each checkpoint's tensors (``ckpt/<model_id>/<kind>/<name>.pt``).

A future is recorded when it is created and when it ends; one the file still holds as running when the
server starts again was cut off by the restart, and is answered as failed, naming that.
"""

from __future__ import annotations

import json
import shutil
import sqlite3
import threading
import time
from pathlib import Path
from typing import Any

SCHEMA = """
create table if not exists runs (model_id text primary key, owner text, base text, rank integer,
    targets text, seed integer, created real);
create table if not exists checkpoints (path text primary key, owner text, model_id text, kind text,
    name text, file text, size integer, created real);
create table if not exists futures (request_id text primary key, owner text, state text, error text);
"""
RESTARTED = "the server restarted while this request ran; its result is lost (send it again)"


class Store:
    def __init__(self, root: Path) -> None:
        self.root = root
        root.mkdir(parents=True, exist_ok=True)
        self._lock = threading.Lock()
        self._db = sqlite3.connect(root / "state.sqlite", check_same_thread=False, isolation_level=None)
        self._db.executescript(SCHEMA)
        self._db.execute("update futures set state = 'failed', error = ? where state = 'running'", (RESTARTED,))

    def _run(self, sql: str, args: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
        with self._lock:
            return self._db.execute(sql, args).fetchall()

    # runs
    def add_run(self, model_id: str, owner: str, base: str, rank: int, targets: list[str], seed: int | None) -> None:
        self._run("insert into runs values (?, ?, ?, ?, ?, ?, ?)",
                  (model_id, owner, base, rank, json.dumps(targets), seed, time.time()))

    def run(self, model_id: str) -> dict[str, Any] | None:
        rows = self._run("select owner, base, rank, targets, seed, created from runs where model_id = ?", (model_id,))
        if not rows:
            return None
        owner, base, rank, targets, seed, created = rows[0]
        return {"model_id": model_id, "owner": owner, "base": base, "rank": rank, "targets": json.loads(targets),
                "seed": seed, "created": created}

    def runs(self, owner: str) -> list[dict[str, Any]]:
        ids = [r[0] for r in self._run("select model_id from runs where owner = ? order by created", (owner,))]
        return [r for r in (self.run(i) for i in ids) if r is not None]

    # checkpoints
    def checkpoint_file(self, model_id: str, kind: str, name: str) -> Path:
        path = self.root / "ckpt" / model_id / kind / f"{name}.pt"
        path.parent.mkdir(parents=True, exist_ok=True)
        return path

    def add_checkpoint(self, path: str, owner: str, model_id: str, kind: str, name: str, file: Path) -> None:
        self._run("insert or replace into checkpoints values (?, ?, ?, ?, ?, ?, ?, ?)",
                  (path, owner, model_id, kind, name, str(file), _size(file), time.time()))

    def checkpoint(self, path: str) -> dict[str, Any] | None:
        rows = self._run("select owner, model_id, kind, name, file, size, created from checkpoints where path = ?",
                         (path,))
        if not rows:
            return None
        keys = ("owner", "model_id", "kind", "name", "file", "size", "created")
        return {"path": path, **dict(zip(keys, rows[0], strict=True))}

    def checkpoints(self, owner: str, model_id: str | None = None) -> list[dict[str, Any]]:
        paths = [r[0] for r in self._run(
            "select path from checkpoints where owner = ? and (? is null or model_id = ?) order by created",
            (owner, model_id, model_id))]
        return [c for c in (self.checkpoint(p) for p in paths) if c is not None]

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


def _size(file: Path) -> int:
    """A checkpoint's bytes: its file's, or its folder's files' (external weights)."""
    return sum(f.stat().st_size for f in file.iterdir()) if file.is_dir() else file.stat().st_size
