"""The composition root: the store, the engine host, the controller and the window of one app session.

Start-up order: the conversation store; the built-in model (ready, or to be assembled from its part packages, or
missing); the snapshot cache, the remote endpoints and the engine host (whose factory opens local files and remote
models alike); the controller, telemetry, downloads, the API server (on the engine host) and window. ``start`` opens
the last conversation and loads its model, and starts the API server if it was left on; on a first start it first
assembles the built-in model on a background thread with a progress dialog, and loads it when that is done.
"""

from __future__ import annotations

import gc
import sys
from pathlib import Path

from .api_server import ApiServer
from .builtin_model import BuiltinModel, BuiltinModelError
from .builtin_setup import BuiltinAssembly
from .chat_controller import ChatController
from .conversation_actions import ConversationActions
from .downloads_bridge import DownloadsBridge
from .model_choices import ModelChoices
from .models.downloads import DownloadManager
from .models.remote_endpoints import RemoteEndpoints
from .models.library import ModelLibrary
from .snapshot_cache import SnapshotCache, default_memory_budget, default_memory_dir
from .store import DB_FILENAME, ConversationStore
from .telemetry import SystemSampler, Telemetry
from .ui.builtin_progress import BuiltinProgressDialog
from .ui.main_window import MainWindow
from .engine_host import EngineHost
from .worker import load_engine_model


# How often a thread running Python hands the GIL to one waiting for it. The GUI thread takes and releases the GIL
# many times per event-loop turn (every slot, paint and event filter written in Python); with the default 5 ms each of
# those waits while the engine thread runs Python. Kept after the vocabulary's loops moved into C (strings.c), by
# measurement (tests/app/test_responsiveness.py, 2 cores): on a quiet machine 5 ms and 1 ms both kept every gap at
# 14-46 ms, but with both cores busy (two CPU-bound processes beside the test) 5 ms let a prefill pause the GUI
# 156 ms (other runs 33-74 ms), 1 ms at most 69 ms.
GIL_SWITCH_INTERVAL_S = 0.001


def freeze_startup_objects() -> None:
    """Move every object alive after start-up out of the garbage collector's reach, once per process.

    A full collection holds the GIL while it walks every tracked object: after the imports (PySide6, NumPy, jinja2,
    pydantic) that is ~115,000 objects and 60-67 ms on a 2-core EPYC, a pause of the GUI thread whenever an engine
    thread's allocations trigger one (76 ms during a model's load in tests/app/test_responsiveness.py). Frozen, the
    same collection walks ~2,000 objects in 0.6 ms. Objects that outlive start-up (modules, classes, functions, the
    window) are never cyclic garbage in practice; models, conversations and replies are made later and stay
    collectable. Garbage already present is collected first, so nothing is frozen that could be freed."""
    if gc.get_freeze_count() == 0:
        gc.collect()
        gc.freeze()


class AppSession:
    """Everything one window needs, built in start-up order and torn down in reverse."""

    def __init__(self, data: Path, model: str | None = None, engine_factory=None, builtin: BuiltinModel | None = None):
        self.data = data
        self.closed = False
        sys.setswitchinterval(GIL_SWITCH_INTERVAL_S)
        self.store, self.recovery_notice = ConversationStore.open(data / DB_FILENAME)
        self.builtin = builtin or BuiltinModel()
        self.assembly: BuiltinAssembly | None = None
        self.progress_dialog: BuiltinProgressDialog | None = None
        builtin, self.builtin_problem = self._find_builtin()
        self.snapshots = SnapshotCache(data / "snapshots", memory_dir=default_memory_dir(data),
                                       memory_budget=default_memory_budget())
        self.snapshots.retain(c.id for c in self.store.conversations())
        self.remote = RemoteEndpoints(data)  # remote models open through the same engine factory as local files
        self.host = EngineHost(self.remote.engine_factory(engine_factory or load_engine_model),
                               snapshots=self.snapshots)
        default = model or (str(builtin) if builtin else None)
        self.controller = ChatController(self.store, self.host, default, builtin_path=str(builtin) if builtin else None)
        self.actions = ConversationActions(self.controller)
        self.telemetry = Telemetry(SystemSampler(applied=lambda: self.host.thermal.policy.limits))
        self.host.telemetry.connect(self.telemetry.add_engine_sample)
        self.host.thermal_decided.connect(self.telemetry.add_thermal_decision)
        self.downloads = DownloadsBridge(DownloadManager(data))
        choices = ModelChoices(data, builtin, remote=self.remote)
        self.api_server = ApiServer(self.host, self.store, library=lambda: library_ids(choices),
                                    n_ctx=lambda: self.controller.default_settings().n_ctx)
        self.window = MainWindow(self.controller, choices, telemetry=self.telemetry, actions=self.actions,
                                 downloads=self.downloads, api_server=self.api_server)
        freeze_startup_objects()

    def _find_builtin(self) -> tuple[Path | None, str | None]:
        """The built-in model's path (ready, or to be assembled from parts that are all installed), or the problem."""
        if self.builtin.is_ready():
            return self.builtin.path, None
        try:
            self.builtin.part_files()
        except BuiltinModelError as e:
            return None, str(e)
        return self.builtin.path, None

    def start(self) -> None:
        pending = self.controller.builtin_path is not None and not self.builtin.is_ready()
        if pending:
            self.controller.pending_model = self.controller.builtin_path
        self.controller.start()
        problems = [self.recovery_notice, *self.downloads.manager.notices, *self.snapshots.notices,
                    *ModelLibrary(self.data, scan_dirs=[], builtin=None).check_registry()]
        if any(problems):
            self.window.notice_bar.show_notice("error", " ".join(p for p in problems if p))
        elif self.builtin_problem:
            self.window.notice_bar.show_notice("error", f"The built-in model is missing: {self.builtin_problem}")
        if pending:
            self._assemble_builtin()
        if self.api_server.settings.enabled:
            self.api_server.start()

    def _assemble_builtin(self) -> None:
        """Assemble the built-in model in the background; the controller loads it when that is done."""
        self.progress_dialog = BuiltinProgressDialog(self.builtin.name, self.window)
        self.assembly = BuiltinAssembly(self.builtin)
        self.assembly.progress.connect(self.progress_dialog.show_progress)
        self.assembly.finished.connect(self._on_builtin_ready)
        self.assembly.failed.connect(self._on_builtin_failed)
        self.progress_dialog.show()
        self.assembly.start()

    def _on_builtin_ready(self, path: str) -> None:
        self._close_progress()
        self.controller.model_ready(path)

    def _on_builtin_failed(self, message: str) -> None:
        self._close_progress()
        self.controller.pending_model = None
        self.window.notice_bar.show_notice("error", f"The built-in model could not be prepared: {message}")

    def _close_progress(self) -> None:
        if self.progress_dialog is not None:
            self.progress_dialog.close()
            self.progress_dialog.deleteLater()
            self.progress_dialog = None

    def close(self) -> None:
        self.closed = True
        if self.assembly is not None:
            self.assembly.stop()
        self._close_progress()
        self.controller.stop_and_forget()
        self.api_server.stop()
        self.actions.wait_for_exports()
        self.host.shutdown()
        self.snapshots.close()
        self.downloads.shutdown()
        self.window.close()
        self.store.close()


def library_ids(choices: ModelChoices) -> dict[str, str]:
    """The library's usable local models by the id API clients send (the file name without .gguf).

    Remote models are left out: the app's server answers from this machine's engine, it does not proxy endpoints.
    """
    from engine.remote import is_remote_ref
    from engine.serve.library import model_id
    try:
        rows = choices.list()
    except Exception:  # noqa: BLE001 - a broken scan leaves the API with the loaded model only
        return {}
    return {model_id(row.path): row.path for row in rows if row.usable and not is_remote_ref(row.path)}
