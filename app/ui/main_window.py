"""The main window: navigation rail, the Chat page (sidebar, messages, composer, settings), the Models page, the
dashboard, the Server page and the Default settings page."""

from __future__ import annotations

from PySide6.QtCore import QSize, Qt
from PySide6.QtGui import QAction, QKeySequence, QShortcut
from PySide6.QtWidgets import (QButtonGroup, QFrame, QHBoxLayout, QLabel, QMainWindow, QMessageBox, QSplitter,
                               QStackedWidget, QToolButton, QVBoxLayout, QWidget)

from ..chat_controller import ChatController
from ..conversation_actions import ConversationActions
from ..downloads_bridge import DownloadsBridge
from ..draft_models import DraftCompatibility
from ..generation_history import recent_generations
from ..model_choices import BASE_MODEL_LABEL, ModelChoices
from ..remote_bridge import RemoteBridge
from ..telemetry import Telemetry
from .about_dialog import AboutDialog
from .chat_view import ChatView
from .composer import Composer
from .dashboard_page import DashboardPage
from .default_settings_page import DefaultSettingsPage
from .conversation_menu import ConversationMenu
from .downloads_panel import DownloadsPanel
from .elided_label import ElidedLabel
from .models_page import ModelsPage
from .remote_endpoint_dialog import RemoteEndpointDialog
from .notice_bar import NoticeBar
from .server_page import ServerPage
from .settings_panel import SettingsPanel
from .sidebar import Sidebar
from .status_strip import StatusStrip
from .theme import app_icon, icon

PAGES = ("chat", "models", "dashboard", "server", "defaults")
RAIL = (("chat", "Chat", "chat"), ("models", "Models", "models"), ("dashboard", "Live", "dashboard"),
        ("server", "Server", "server"), ("defaults", "Defaults", "settings"))  # page, label, icon
CHAT_MIN_WIDTH = 380


class MainWindow(QMainWindow):
    """Renders the controller's state and forwards the user's intents to it; holds no chat logic itself.

    Signals:
        none of its own; the views' intents go straight to the ChatController.
    """

    def __init__(self, controller: ChatController, model_choices: ModelChoices, parent: QWidget | None = None,
                 actions: ConversationActions | None = None,
                 telemetry: Telemetry | None = None, downloads: DownloadsBridge | None = None, api_server=None):
        super().__init__(parent)
        self.controller = controller
        self.model_choices = model_choices
        self.remote_bridge = RemoteBridge(model_choices, self) if model_choices.remote is not None else None
        self.actions = actions
        self.telemetry = telemetry or Telemetry(parent=self)
        self.downloads = downloads
        self.api_server = api_server  # app.api_server.ApiServer, or None (the page then only shows its form)
        self.draft_compatibility = DraftCompatibility()
        self.confirm = lambda title, text: QMessageBox.question(self, title, text) == QMessageBox.StandardButton.Yes
        self._deleted: tuple[int, str] | None = None
        self._model_info: dict = {}  # the loaded model's name, backend, ... as the controller last reported
        self._base_models: dict[str | None, bool] = {}  # model path -> no chat template
        self.setWindowIcon(app_icon())
        self.resize(1180, 760)
        self.setMinimumSize(720, 480)
        self._build()
        self._connect()
        self._connect_conversation_menu()
        self._connect_downloads()
        self._connect_server()

    # -- building ------------------------------------------------------------------------------------
    def _build(self) -> None:
        self.sidebar = Sidebar()
        self.chat_view = ChatView()
        self.composer = Composer()
        self.notice_bar = NoticeBar()
        self.settings_panel = SettingsPanel()
        self.settings_panel.hide()
        self.title = ElidedLabel()
        self.title.setObjectName("chatTitle")
        self.settings_button = QToolButton()
        self.settings_button.setCheckable(True)
        self.settings_button.setToolTip("Conversation settings (Ctrl+,)")
        self.settings_button.setAutoRaise(True)
        self.settings_button.setIcon(icon("settings"))
        header = QHBoxLayout()
        header.setContentsMargins(16, 8, 8, 8)
        header.addWidget(self.title, 1)
        self.conversation_menu = ConversationMenu()
        header.addWidget(self.conversation_menu)
        header.addWidget(self.settings_button)
        center = QWidget()
        center_layout = QVBoxLayout(center)
        center_layout.setContentsMargins(0, 0, 0, 0)
        center_layout.setSpacing(0)
        center_layout.addLayout(header)
        notice_row = QHBoxLayout()
        notice_row.setContentsMargins(16, 0, 16, 4)
        notice_row.addWidget(self.notice_bar)
        center_layout.addLayout(notice_row)
        center_layout.addWidget(self.chat_view, 1)
        center_layout.addWidget(self.composer)
        self.splitter = QSplitter()
        self.splitter.setChildrenCollapsible(False)
        self.splitter.addWidget(self.sidebar)
        self.splitter.addWidget(center)
        self.splitter.addWidget(self.settings_panel)
        self.splitter.setStretchFactor(1, 1)
        self.splitter.setSizes([260, 700, 300])
        self.sidebar.setMinimumWidth(180)
        center.setMinimumWidth(CHAT_MIN_WIDTH)  # the side panels give way first (see _fit_side_panels)
        self.downloads_panel = DownloadsPanel() if self.downloads is not None else None
        self.models_page = ModelsPage(downloads=self.downloads_panel)
        self.dashboard = DashboardPage(self.telemetry, lambda limit: recent_generations(self.controller.store, limit),
                                       thermal_mode=self.controller)
        self.defaults_page = DefaultSettingsPage()
        self.defaults_page.set_defaults(self.controller.default_settings())
        self.server_page = ServerPage()
        self.stack = QStackedWidget()
        self.pages = {"chat": self.splitter, "models": self.models_page, "dashboard": self.dashboard,
                      "server": self.server_page, "defaults": self.defaults_page}
        for name in PAGES:
            self.stack.addWidget(self.pages[name])
        self.rail = QFrame()
        self.rail.setObjectName("rail")
        rail_layout = QVBoxLayout(self.rail)
        rail_layout.setContentsMargins(6, 10, 6, 10)
        rail_layout.setSpacing(6)
        self.nav = QButtonGroup(self)
        self.nav_buttons = {}
        for index, (name, label, icon_name) in enumerate(RAIL):
            button = QToolButton()
            button.setText(label)
            button.setCheckable(True)
            button.setToolButtonStyle(Qt.ToolButtonStyle.ToolButtonTextUnderIcon)
            button.setIconSize(QSize(22, 22))
            button.setFixedWidth(64)
            button.setIcon(icon(icon_name))
            self.nav.addButton(button, index)
            self.nav_buttons[name] = button
            rail_layout.addWidget(button)
        rail_layout.addStretch(1)
        self.about_button = QToolButton()
        self.about_button.setText("About")
        self.about_button.setToolTip("About Hearth")
        self.about_button.setAutoRaise(True)
        self.about_button.setToolButtonStyle(Qt.ToolButtonStyle.ToolButtonTextUnderIcon)
        self.about_button.setIconSize(QSize(22, 22))
        self.about_button.setFixedWidth(64)
        self.about_button.setIcon(icon("about"))
        self.about_button.clicked.connect(self.show_about)
        rail_layout.addWidget(self.about_button)
        self.nav_buttons["chat"].setChecked(True)
        body = QWidget()
        body_layout = QHBoxLayout(body)
        body_layout.setContentsMargins(0, 0, 0, 0)
        body_layout.setSpacing(0)
        body_layout.addWidget(self.rail)
        body_layout.addWidget(self.stack, 1)
        self.setCentralWidget(body)
        self.statusBar().setSizeGripEnabled(False)
        self.status_strip = StatusStrip(self.telemetry)
        self.statusBar().addPermanentWidget(self.status_strip)
        self._build_menu_bar()

    def _build_menu_bar(self) -> None:
        """File: New chat, Settings, Quit (on macOS Qt moves Quit and Settings into the app menu)."""
        menu = self.menuBar().addMenu("&File")
        self.new_chat_action = QAction("&New chat", self, shortcut=QKeySequence.StandardKey.New)
        self.settings_action = QAction("&Settings…", self, shortcut=QKeySequence("Ctrl+,"),
                                       menuRole=QAction.MenuRole.PreferencesRole)
        self.quit_action = QAction("&Quit", self, shortcut=QKeySequence("Ctrl+Q"),  # Cmd+Q on macOS
                                   menuRole=QAction.MenuRole.QuitRole)
        self.settings_action.triggered.connect(self._toggle_settings)
        self.quit_action.triggered.connect(self.close)
        for action in (self.new_chat_action, self.settings_action, None, self.quit_action):
            menu.addSeparator() if action is None else menu.addAction(action)
        help_menu = self.menuBar().addMenu("&Help")
        help_menu.addAction("&About Hearth", self.show_about).setMenuRole(QAction.MenuRole.AboutRole)

    def _connect(self) -> None:
        c = self.controller
        self.nav.idClicked.connect(lambda index: self.show_page(PAGES[index]))
        self.sidebar.new_requested.connect(self._new_chat)
        self.sidebar.selected.connect(c.open_conversation)
        self.sidebar.rename_requested.connect(c.rename)
        self.sidebar.delete_requested.connect(c.delete_conversation)
        self.sidebar.search_changed.connect(lambda _: self._refresh_conversations())
        self.composer.send_requested.connect(self._send)
        self.composer.stop_requested.connect(c.stop)
        self.chat_view.edit_submitted.connect(c.edit_and_resend)
        self.chat_view.delete_requested.connect(c.delete_message)
        self.chat_view.regenerate_requested.connect(c.regenerate)
        self.chat_view.alternative_requested.connect(c.show_alternative)
        self.settings_panel.settings_changed.connect(c.update_settings)
        self.settings_panel.reset_settings = c.default_settings
        self.defaults_page.defaults_changed.connect(c.set_default_settings)
        self.settings_panel.choose_model_requested.connect(lambda: self.show_page("models"))
        self.settings_button.toggled.connect(self._show_settings)
        self.models_page.use_requested.connect(self._use_model)
        self.models_page.add_requested.connect(self._add_model)
        self.models_page.refresh_requested.connect(self._refresh_models)
        self.models_page.remove_requested.connect(self._remove_model)
        self.models_page.add_remote_requested.connect(self._add_remote)
        if self.remote_bridge is not None:
            self.remote_bridge.added.connect(lambda text: (self._refresh_models(), self._tell("info", text)))
            self.remote_bridge.failed.connect(lambda text: self._tell("error", text))
            self.remote_bridge.refreshed.connect(lambda text: (self._refresh_models(),
                                                               self._tell("warning", text) if text else None))
            self.models_page.refresh_requested.connect(self.remote_bridge.refresh_all)
        self.notice_bar.action_triggered.connect(self._undo_delete)
        c.conversations_changed.connect(self._refresh_conversations)
        c.conversation_opened.connect(self._on_conversation_opened)
        c.messages_changed.connect(self._on_messages_changed)
        c.reply_text.connect(self.chat_view.set_streaming_text)
        c.reply_thinking.connect(self.chat_view.set_streaming_thinking)
        c.generating_changed.connect(self.composer.set_generating)
        c.model_changed.connect(self._on_model_changed)
        c.status.connect(lambda text: self.statusBar().showMessage(text))
        c.notice.connect(self.notice_bar.show_notice)
        c.context_usage.connect(self.composer.set_context_usage)
        c.conversation_deleted.connect(self._on_deleted)
        c.model_changed.connect(self.status_strip.set_model)
        c.model_changed.connect(self.dashboard.set_model)
        c.reply_finished.connect(lambda *_: self.dashboard.refresh_generations())
        self.status_strip.activated.connect(lambda: self.show_page("dashboard"))
        self.new_chat_action.triggered.connect(self._new_chat)
        QShortcut(QKeySequence(Qt.Key.Key_Escape), self, activated=c.stop)
        QShortcut(QKeySequence.StandardKey.Find, self, activated=self.sidebar.search.setFocus)

    def _connect_conversation_menu(self) -> None:
        menu, actions, c = self.conversation_menu, self.actions, self.controller
        menu.rename_requested.connect(lambda: self.sidebar.start_rename(c.current_id))
        menu.delete_requested.connect(lambda: c.delete_conversation(c.current_id) if c.current_id else None)
        if actions is None:
            for name, action in menu.actions_by_name.items():
                action.setVisible(name in ("rename", "delete"))
            return
        exports = {"json": actions.export_json, "markdown": actions.export_markdown, "all": actions.export_all}
        imports = {"json": actions.import_file, "all": actions.import_archive}
        menu.export_requested.connect(lambda kind, path: exports[kind](path))
        menu.import_requested.connect(lambda kind, path: imports[kind](path))
        menu.save_state_requested.connect(actions.save_state)
        menu.restore_state_requested.connect(actions.restore_state)
        actions.notice.connect(self.notice_bar.show_notice)

    def _connect_downloads(self) -> None:
        bridge, panel = self.downloads, self.downloads_panel
        if bridge is None:
            return
        panel.search_requested.connect(bridge.search)
        panel.repo_selected.connect(lambda repo: bridge.list_files(repo, panel.n_ctx()))
        panel.n_ctx_changed.connect(lambda n_ctx: bridge.list_files(panel.repo, n_ctx) if panel.repo else None)
        panel.download_requested.connect(bridge.start)
        panel.pause_requested.connect(bridge.pause)
        panel.resume_requested.connect(bridge.resume)
        panel.cancel_requested.connect(bridge.cancel)
        bridge.curated.connect(panel.set_curated)
        bridge.search_results.connect(panel.set_search_results)
        bridge.files_listed.connect(panel.set_files)
        bridge.file_judged.connect(panel.set_file_verdict)
        bridge.download_changed.connect(panel.update_download)
        bridge.download_completed.connect(self._on_downloaded)
        bridge.failed.connect(lambda what, reason: panel.show_message(f"{what}: {reason}", error=True))
        bridge.load_curated()
        for progress in bridge.downloads():  # paused or failed ones from an earlier run
            panel.update_download(progress)

    def _connect_server(self) -> None:
        server, page = self.api_server, self.server_page
        if server is None:
            return
        page.set_settings(server.settings)
        page.set_state(server.state())
        page.apply_requested.connect(server.apply)
        server.state_changed.connect(page.set_state)
        server.request_logged.connect(page.add_record)

    def _on_downloaded(self, key: str, path: str) -> None:
        self._refresh_models()
        self._tell("info", f"Downloaded {key.rsplit('/', 1)[-1]}; it is in the list of models now.")

    def _remove_model(self, path: str) -> None:
        """Remove a model after the user confirms what will be deleted; never the loaded one."""
        if path == self.controller.model_info.get("path"):
            self._tell("warning", "This model is loaded. Use another model first, then remove it.")
            return
        try:
            plan = self.model_choices.plan_removal(path)
        except Exception as exc:  # noqa: BLE001 - LibraryError says why (built in, not Hearth's file, ...)
            self._tell("error", f"Cannot remove this model: {exc}")
            return
        if not self.confirm("Remove model", f"Remove {plan.entry.name}?\n\nHearth will {plan.message}."):
            return
        try:
            self.model_choices.remove(path)
        except Exception as exc:  # noqa: BLE001
            self._tell("error", f"Could not remove {plan.entry.name}: {exc}")
            return
        self._refresh_models()
        self._tell("info", f"Removed {plan.entry.name}.")

    def _tell(self, kind: str, text: str) -> None:
        """What came of an action on the Models page: shown there, where it was taken, and in the status bar."""
        self.models_page.show_message(kind, text)
        self.statusBar().showMessage(text, 15000)

    def _toggle_settings(self) -> None:
        self.show_page("chat")
        self.settings_button.toggle()

    def _show_settings(self, visible: bool) -> None:
        self.settings_panel.setVisible(visible)
        self._fit_side_panels()
        self._refresh_draft_models()

    def _fit_side_panels(self) -> None:
        """In a narrow window the settings panel takes the sidebar's place, so the chat keeps its room."""
        settings = not self.settings_panel.isHidden()  # (also while another page is shown)
        room = self.width() - self.rail.sizeHint().width() - CHAT_MIN_WIDTH - 2 * self.splitter.handleWidth()
        panel = max(self.settings_panel.minimumWidth(), self.settings_panel.minimumSizeHint().width())
        needed = max(self.sidebar.minimumWidth(), self.sidebar.minimumSizeHint().width()) + panel
        self.sidebar.setVisible(not settings or room >= needed)

    def resizeEvent(self, event) -> None:  # noqa: N802 - Qt override
        super().resizeEvent(event)
        self._fit_side_panels()

    # -- pages ---------------------------------------------------------------------------------------
    def show_about(self) -> AboutDialog:
        """Open the About box (non-blocking) and return it."""
        dialog = AboutDialog(self._model_info.get("backend"), self)
        dialog.setAttribute(Qt.WidgetAttribute.WA_DeleteOnClose)
        dialog.open()
        return dialog

    def show_page(self, name: str) -> None:
        self.defaults_page.flush()  # an edit of the defaults applies before the next new chat
        self.stack.setCurrentWidget(self.pages[name])
        self.nav_buttons[name].setChecked(True)
        if name == "models":
            self._refresh_models()

    def _refresh_models(self) -> None:
        try:
            models = self.model_choices.list()
        except Exception as exc:  # noqa: BLE001 - a broken scan must not take the window down
            self.models_page.show_message("error", f"Could not list the models: {exc}")
            models = []
        self.models_page.set_models(models, self.controller.model_path())
        self._refresh_draft_models(models)

    def _refresh_draft_models(self, models=None) -> None:
        """Offer the library's models that can draft for the shown conversation's model (only while the settings
        panel is open: the first check of a model reads its vocabulary)."""
        target = self.controller.model_path()
        if not self.settings_panel.isVisible() or not target:
            return
        try:
            drafts = self.draft_compatibility.compatible(target, models or self.model_choices.list())
        except Exception as exc:  # noqa: BLE001 - a broken scan must not take the window down
            self.notice_bar.show_notice("error", f"Could not list the draft models: {exc}")
            drafts = []
        self.settings_panel.set_draft_models([(c.name, c.path) for c in drafts])

    def _use_model(self, path: str) -> None:
        self.controller.set_model(path)
        self.show_page("chat")

    def _add_remote(self) -> None:
        """Ask for a remote endpoint and add it in the background (the page says what came of it)."""
        if self.remote_bridge is None:
            self._tell("error", "Remote endpoints are not available in this window.")
            return
        dialog = RemoteEndpointDialog(self.model_choices.remote.secrets.where, self)
        if dialog.exec() and dialog.values()[0]:
            self._tell("info", f"Adding {dialog.values()[0]}: listing its models…")
            self.remote_bridge.add(*dialog.values())
        dialog.deleteLater()

    def _add_model(self, path: str) -> None:
        """Add a file to the library, and only that: the open conversation keeps its model."""
        try:
            choice = self.model_choices.add_file(path)
        except Exception as exc:  # noqa: BLE001 - the library explains what is wrong with the file
            self.models_page.show_add_failed(path, str(exc))
            return
        self._refresh_models()
        self.models_page.show_added(choice)

    # -- rendering the controller's state -----------------------------------------------------------------
    def _new_chat(self) -> None:
        self.defaults_page.flush()  # an edit of the defaults still settling applies to this chat
        self.controller.new_conversation()

    def _send(self, text: str) -> None:
        self.settings_panel.flush()
        self.controller.send(text)
        self.chat_view.scroll_to_bottom()

    def _refresh_conversations(self) -> None:
        c = self.controller
        self.sidebar.set_conversations(c.store.conversations(self.sidebar.search.text()), c.current_id, c.answering())
        if c.current_id is not None:
            title = c.store.conversation(c.current_id).title
            self.title.set_full_text(title)
            self.conversation_menu.set_title(title)
            self.setWindowTitle(f"{title} — Hearth")

    def _on_conversation_opened(self, conversation_id: int) -> None:
        self._refresh_conversations()
        self.settings_panel.set_settings(self.controller.settings())
        self._show_model_text()
        self._on_messages_changed(conversation_id)
        self.chat_view.scroll_to_bottom()
        self.composer.edit.setFocus()

    def _on_messages_changed(self, conversation_id: int) -> None:
        c = self.controller
        if conversation_id != c.current_id:
            return
        self.chat_view.set_messages(c.messages(), c.streaming_message_id() if c.is_generating() else None,
                                    c.model_name(), self._empty_text())

    def _empty_text(self) -> str:
        name = self.controller.model_info.get("name")
        state = f"{name} is ready." if name else "The model is loading; you can start typing."
        if self._is_base_model():
            state += (f"</p><p><b>{self.controller.model_name()} is a {BASE_MODEL_LABEL}.</b> It was not trained to "
                      "chat: it continues the text it is given, so its answers may ramble or repeat. Choose a chat "
                      "(instruct) model on the Models page to chat.")
        return f"<h2>Start a conversation</h2><p>{state}</p><p>Everything stays on this computer.</p>"

    def _is_base_model(self) -> bool:
        """Whether the shown conversation's model has no chat template (read from the file once per path)."""
        path = self.controller.model_path()
        if path not in self._base_models:
            try:
                self._base_models[path] = self.model_choices.is_base_model(path)
            except Exception:  # noqa: BLE001 - an unreadable file is reported when it loads; no label then
                self._base_models[path] = False
        return self._base_models[path]

    def _on_model_changed(self, info: dict) -> None:
        self._model_info = dict(info or {})
        self.models_page.set_current(info)
        self.settings_panel.set_thinking_available(self.controller.reasoning().has_switch)
        unsupported = self._model_info.get("unsupported") or {}  # a remote model: greyed out, with the reason
        self.settings_panel.set_speculation_unavailable(unsupported.get("speculation"))
        self.conversation_menu.set_state_unavailable(unsupported.get("kv_snapshots"))
        self._show_model_text()
        self._on_messages_changed(self.controller.current_id)

    def _show_model_text(self) -> None:
        name = self.controller.model_name()
        self.composer.set_model_text(f"{name} · {BASE_MODEL_LABEL}" if self._is_base_model() else name)
        self.settings_panel.set_model(name)
        self._refresh_draft_models()

    def _on_deleted(self, conversation_id: int, title: str) -> None:
        self._deleted = (conversation_id, title)
        self.notice_bar.show_notice("info", f"Deleted “{title}”.", action="Undo")

    def _undo_delete(self) -> None:
        if self._deleted:
            self.controller.undo_delete(self._deleted[0])
            self._deleted = None

