"""The composition root: the store, the engine host, the controller and the window of one app session."""

from __future__ import annotations

from pathlib import Path

from .chat_controller import ChatController
from .conversation_actions import ConversationActions
from .downloads_bridge import DownloadsBridge
from .model_choices import ModelChoices
from .models.downloads import DownloadManager
from .paths import BuiltinModelMissingError, builtin_model_path
from .snapshot_cache import SnapshotCache, default_memory_budget, default_memory_dir
from .store import DB_FILENAME, ConversationStore
from .telemetry import SystemSampler, Telemetry
from .ui.main_window import MainWindow
from .engine_host import EngineHost
from .worker import load_engine_model


class AppSession:
    """Everything one window needs, built in start-up order and torn down in reverse."""

    def __init__(self, data: Path, model: str | None = None, engine_factory=None):
        self.data = data
        self.closed = False
        self.store, self.recovery_notice = ConversationStore.open(data / DB_FILENAME)
        try:
            builtin = builtin_model_path()
        except BuiltinModelMissingError as e:
            builtin, self.builtin_problem = None, str(e)
        else:
            self.builtin_problem = None
        self.snapshots = SnapshotCache(data / "snapshots", memory_dir=default_memory_dir(data),
                                       memory_budget=default_memory_budget())
        self.snapshots.retain(c.id for c in self.store.conversations())
        self.host = EngineHost(engine_factory or load_engine_model, snapshots=self.snapshots)
        default = model or (str(builtin) if builtin else None)
        self.controller = ChatController(self.store, self.host, default, builtin_path=str(builtin) if builtin else None)
        self.actions = ConversationActions(self.controller)
        self.telemetry = Telemetry(SystemSampler(applied=lambda: self.host.thermal.policy.limits))
        self.host.telemetry.connect(self.telemetry.add_engine_sample)
        self.host.thermal_decided.connect(self.telemetry.add_thermal_decision)
        self.downloads = DownloadsBridge(DownloadManager(data))
        self.window = MainWindow(self.controller, ModelChoices(data, builtin), telemetry=self.telemetry,
                                 actions=self.actions,
                                 downloads=self.downloads)

    def start(self) -> None:
        self.controller.start()
        problems = [self.recovery_notice, *self.downloads.manager.notices]
        if any(problems):
            self.window.notice_bar.show_notice("error", " ".join(p for p in problems if p))
        elif self.builtin_problem:
            self.window.notice_bar.show_notice("error", f"The built-in model is missing: {self.builtin_problem}")

    def close(self) -> None:
        self.closed = True
        self.controller.stop_and_forget()
        self.host.shutdown()
        self.snapshots.close()
        self.downloads.shutdown()
        self.window.close()
        self.store.close()
