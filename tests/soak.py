"""Soak: the app's controller driven through many replies, sampling RSS, open files, threads and the database size.

A whole app session (store, engine worker on its thread, controller, window offscreen) answers ``replies`` prompts
across ``conversations`` conversations on two tiny random-weight models, with model switches, stops mid-answer,
regenerations, JSON exports and KV snapshot saves mixed in. After the warm-up, growth beyond ``BOUNDS`` is a leak.
``tests/app/test_soak.py`` runs a short variant in CI; the long run is a command:

    python -m tests.soak --replies 2000 --conversations 50 --csv soak.csv

It prints one line per sample and, at the end, the slope of each figure per 1,000 replies after the warm-up.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import sqlite3
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path

os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")

import psutil  # noqa: E402

from app.store import DB_FILENAME  # noqa: E402

WARM_UP = 0.25  # the first quarter of the replies: caches fill, pools start, the allocator settles
# Growth allowed from the end of the warm-up to the end of the run (the CI variant fails beyond these).
BOUNDS = {"rss_mib": 40.0, "fds": 2, "threads": 2}
DB_BYTES_PER_REPLY = 4_000  # the database grows with what it stores: a short reply, its prompt, their stats (~1 KB)


@dataclasses.dataclass(frozen=True)
class Sample:
    replies: int
    rss_mib: float
    fds: int
    threads: int
    db_bytes: int


def take_sample(replies: int, data: Path) -> Sample:
    proc = psutil.Process()
    db = database_bytes(data / DB_FILENAME)
    fds = proc.num_fds() if hasattr(proc, "num_fds") else proc.num_handles()
    return Sample(replies, proc.memory_info().rss / 2**20, fds, proc.num_threads(), db)


def database_bytes(path: Path) -> int:
    """The database's size in pages (what it holds, the write-ahead log's pages included; the log file itself is
    reused at a bounded size)."""
    db = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
    try:
        return db.execute("PRAGMA page_count").fetchone()[0] * db.execute("PRAGMA page_size").fetchone()[0]
    finally:
        db.close()


def wait_for(signal, trigger: Callable[[], object], accept=lambda *args: True, timeout: float = 120.0) -> tuple:
    """Run ``trigger`` and the event loop until ``signal`` fires with arguments ``accept`` takes; its arguments."""
    from PySide6.QtCore import QEventLoop, QTimer

    loop, got = QEventLoop(), []

    def on(*args):
        if not got and accept(*args):
            got.append(args)
            loop.quit()

    signal.connect(on)
    timer = QTimer(singleShot=True, interval=int(timeout * 1000))
    timer.timeout.connect(loop.quit)
    try:
        timer.start()
        trigger()
        if not got:
            loop.exec()
    finally:
        timer.stop()
        signal.disconnect(on)
    if not got:
        raise TimeoutError(f"no {signal} within {timeout} s")
    return got[0]


def run_soak(work: Path, replies: int, conversations: int, every: int = 10,
             on_sample: Callable[[Sample], None] = lambda s: None) -> list[Sample]:
    """Drive one app session through ``replies`` replies; a sample after every ``every`` replies."""
    from PySide6.QtWidgets import QApplication

    from app.app_session import AppSession
    from tests.engine.gguf_builders import write_tiny_llama

    app = QApplication.instance() or QApplication([])
    models = [str(write_tiny_llama(work / f"tiny-{seed}.gguf", n_ctx=8192, seed=seed)) for seed in (1, 2)]
    data = work / "data"
    data.mkdir(parents=True, exist_ok=True)
    session = AppSession(data, models[0])
    session.window.show()
    session.start()
    c, samples, ids = session.controller, [], []
    try:
        for i in range(replies):
            if len(ids) < conversations:
                ids.append(c.new_conversation())
                c.update_settings(dataclasses.replace(c.settings(), max_tokens=12, temperature=0.8, seed=i))
            else:
                c.open_conversation(ids[i % conversations])
            one_step(session, i, models, work)
            app.processEvents()
            if (i + 1) % every == 0:
                samples.append(take_sample(i + 1, data))
                on_sample(samples[-1])
    finally:
        session.close()
    return samples


def one_step(session, i: int, models: list[str], work: Path) -> None:
    """Reply ``i``: a plain answer, or one of the other actions around it."""
    c, finished = session.controller, session.controller.reply_finished
    if i % 7 == 3:  # switch this conversation's model (it loads before the answer starts)
        c.set_model(models[(i // 7) % 2])
    if i % 5 == 4 and c.store.messages(c.current_id):
        wait_for(finished, c.regenerate)
    elif i % 5 == 2:  # a long answer stopped at its first text
        c.update_settings(dataclasses.replace(c.settings(), max_tokens=400))
        wait_for(c.reply_text, lambda: c.send(f"Tell me a long story, number {i}."), accept=lambda _m, text: bool(text))
        if c.is_generating():  # else it ended by itself already
            wait_for(finished, c.stop)
        c.update_settings(dataclasses.replace(c.settings(), max_tokens=12))
    else:
        wait_for(finished, lambda: c.send(f"Question {i}: what comes next?"))
    if i % 25 == 24:
        assert session.actions.export_json(str(work / "export.json"))
    if i % 10 == 9:
        path, notices = str(work / "state.hearth"), []
        session.actions.notice.connect(lambda kind, text: notices.append(text))
        ok = wait_for(session.actions.state_done, lambda: session.actions.save_state(path),
                      accept=lambda p, _ok: p == path)[1]
        assert ok, f"the KV snapshot was not saved: {notices}"


def growth(samples: list[Sample], replies: int) -> dict[str, float]:
    """Each figure's growth from the end of the warm-up to the end, and the slopes per 1,000 replies."""
    after = [s for s in samples if s.replies > WARM_UP * replies]
    first, last = after[0], after[-1]
    span = max(1, last.replies - first.replies)
    out = {}
    for name in ("rss_mib", "fds", "threads", "db_bytes"):
        out[name] = getattr(last, name) - getattr(first, name)
        out[f"{name}_per_1000"] = _slope([s.replies for s in after], [getattr(s, name) for s in after]) * 1000
    out["db_bytes_per_reply"] = out["db_bytes"] / span
    return out


def _slope(x: list[float], y: list[float]) -> float:
    n = len(x)
    mx, my = sum(x) / n, sum(y) / n
    var = sum((a - mx) ** 2 for a in x)
    return sum((a - mx) * (b - my) for a, b in zip(x, y)) / var if var else 0.0


def problems(g: dict[str, float]) -> list[str]:
    """The bounds a run broke, one line each."""
    out = [f"{name} grew by {g[name]:.1f} after the warm-up (bound {bound})" for name, bound in BOUNDS.items()
           if g[name] > bound]
    if g["db_bytes_per_reply"] > DB_BYTES_PER_REPLY:
        out.append(f"the database grew {g['db_bytes_per_reply']:.0f} bytes per reply (bound {DB_BYTES_PER_REPLY})")
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.soak", description=__doc__.split("\n\n")[0])
    parser.add_argument("--replies", type=int, default=2000)
    parser.add_argument("--conversations", type=int, default=50)
    parser.add_argument("--every", type=int, default=20, help="sample after every N replies")
    parser.add_argument("--csv", help="also write the samples to this CSV file")
    args = parser.parse_args(argv)
    rows = []

    def show(s: Sample) -> None:
        rows.append(s)
        print(f"{s.replies:>6} replies  rss {s.rss_mib:8.1f} MiB  fds {s.fds:4d}  threads {s.threads:3d}  "
              f"db {s.db_bytes / 1e6:8.2f} MB", flush=True)

    with tempfile.TemporaryDirectory(prefix="hearth-soak-") as work:
        samples = run_soak(Path(work), args.replies, args.conversations, args.every, show)
    if args.csv:
        with open(args.csv, "w", encoding="utf-8") as f:
            f.write("replies,rss_mib,fds,threads,db_bytes\n")
            f.writelines(f"{s.replies},{s.rss_mib:.1f},{s.fds},{s.threads},{s.db_bytes}\n" for s in rows)
    g = growth(samples, args.replies)
    print(f"after the warm-up, per 1,000 replies: rss {g['rss_mib_per_1000']:+.1f} MiB, fds {g['fds_per_1000']:+.2f}, "
          f"threads {g['threads_per_1000']:+.2f}, database {g['db_bytes_per_1000'] / 1e6:+.2f} MB")
    found = problems(g)
    print("\n".join(found) or "no growth beyond the bounds")
    return 1 if found else 0


if __name__ == "__main__":
    sys.exit(main())
