"""Hearth's entry point: ``python -m app`` or ``hearth``; ``hearth models ...`` manages the model library and
``hearth serve ...`` serves a model over the OpenAI- and Anthropic-compatible API without a window.

Start-up order:
1. Parse the command line; ``models`` goes to the model library CLI, ``serve`` to the headless API server
   (engine.serve, no Qt) and ``--version`` prints and exits.
2. On Linux with X11, check that the system libraries Qt's xcb plugin needs load (platform_check.py); if any
   are missing, print which and how to install them, and exit 1. Create the QApplication. If another Hearth holds this data dir, ask it to show its window and exit 0
   (single_instance.py); else start the rotating log file and the crash handler in the log dir. The palette
   follows the OS; ``--color-scheme`` can force light or dark.
3. Open the conversation store in the data directory: integrity check, migrations, damaged file moved aside.
4. Start the engine host: the worker QObject on its own QThread (nothing loaded yet).
5. Build the ChatController (store + host + built-in model path) and the MainWindow around it; show the window.
6. The controller opens the last conversation and asks the worker to load its model in the background.
7. Run the event loop; on exit, stop any answer, close the model, end the engine thread, close the store.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path


def _parse(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="hearth", description="Chat with language models on this computer.",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog="commands:\n"
               "  hearth                 open the app (the options above apply)\n"
               "  hearth models ...      list, search, download, import and remove models "
               "(hearth models --help)\n"
               "  hearth serve ...       serve a model over OpenAI- and Anthropic-compatible APIs, headless "
               "(hearth serve --help)\n")
    parser.add_argument("--version", action="store_true", help="print the version and exit")
    parser.add_argument("--data-dir", metavar="DIR", help="keep conversations and settings in DIR")
    parser.add_argument("--smoke-test", metavar="OUTDIR",
                        help="open the window, chat once with the built-in model, save screenshots to OUTDIR, exit")
    parser.add_argument("--color-scheme", choices=("auto", "light", "dark"), default="auto",
                        help="follow the OS (default) or force light or dark")
    parser.add_argument("--model", metavar="GGUF", help="use this model file instead of the built-in one")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["models"]:
        from .models.cli import main as models_main
        return models_main(argv[1:])
    if argv[:1] == ["serve"]:
        from engine.serve.cli import main as serve_main
        return serve_main(argv[1:], library=library_models)
    args = _parse(argv)
    if args.version:
        import engine
        print(f"hearth {engine.__version__}")
        return 0
    return run_app(args)


def library_models(data: str | None) -> dict[str, str]:
    """The model library's runnable models by the id API clients send (``hearth serve --library``)."""
    from engine.serve.library import model_id

    from .models.library import ModelLibrary
    from .paths import data_dir
    return {model_id(e.path): str(e.path) for e in ModelLibrary(data_dir(data)).list() if e.supported}


def run_app(args: argparse.Namespace) -> int:
    from .platform_check import check_xcb

    if (problem := check_xcb()) is not None:  # before Qt loads its platform plugin, which would abort
        print(problem, file=sys.stderr)
        return 1
    from PySide6.QtWidgets import QApplication

    import engine

    from .app_session import AppSession
    from .crash_handler import CrashHandler, ask_to_open_log_folder
    from .logging_setup import debug_requested, setup_logging
    from .paths import data_dir, log_dir
    from .single_instance import SingleInstance, bring_to_front
    from .startup_probe import StartupProbe, probe_mode
    from .ui.theme import ThemeKeeper, app_icon, apply_color_scheme

    data = data_dir(args.data_dir or (Path(args.smoke_test) / "data" if args.smoke_test else None))
    app = QApplication.instance() or QApplication([sys.argv[0]])
    instance = SingleInstance(data)
    if not instance.acquire():  # a second launch touches none of the first one's files
        if instance.activate_running():
            return 0
        print(f"Hearth is already running on {data} but did not answer; close it and try again.", file=sys.stderr)
        return 1
    logs = log_dir(data if args.data_dir or args.smoke_test else None)
    setup_logging(logs, debug=debug_requested())
    crash = CrashHandler(logs, engine.__version__, prompt=None if args.smoke_test else ask_to_open_log_folder).install()
    app.setApplicationName("Hearth")
    app.setApplicationVersion(engine.__version__)
    app.setApplicationDisplayName("Hearth")
    app.setDesktopFileName("hearth")
    app.setWindowIcon(app_icon())
    apply_color_scheme(app, args.color_scheme)
    theme = ThemeKeeper(app)  # noqa: F841 - lives as the app's child, re-styles on light/dark switches
    session = AppSession(data, args.model)
    instance.activation_requested.connect(lambda: bring_to_front(session.window))
    if probe_mode():
        StartupProbe(session.window, quit_after=probe_mode() == "quit")
    session.window.show()
    session.start()
    if args.smoke_test:
        from .smoke_test import SmokeTest
        smoke = SmokeTest(session, Path(args.smoke_test))
        smoke.start()
    elif os.environ.get("HEARTH_SCRIPT"):
        from .scripted_session import ScriptedSession
        script = ScriptedSession(session.controller, os.environ["HEARTH_SCRIPT"])
        script.start()
    code = app.exec()
    session.close()
    instance.release()
    crash.uninstall()
    if args.smoke_test:
        return smoke.exit_code
    return code


if __name__ == "__main__":
    raise SystemExit(main())
