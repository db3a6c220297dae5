"""The Default settings page keeps its form one readable column wide, from a narrow window to 4K."""

import pytest

from app.chat_settings import ChatSettings
from app.ui.default_settings_page import MAX_CONTENT_WIDTH, DefaultSettingsPage

pytestmark = [pytest.mark.gui,
              pytest.mark.qt_log_ignore("does not support propagateSizeHints")]  # the offscreen plugin, top level
MARGIN = 24


def shown_at(qtbot, width, height):
    page = DefaultSettingsPage()
    qtbot.addWidget(page)
    page.set_defaults(ChatSettings())
    page.resize(width, height)
    page.show()
    qtbot.waitExposed(page)
    return page


@pytest.mark.parametrize("width, height", [(1280, 800), (3840, 2160)])
def test_the_fields_stop_growing_on_a_wide_window(qtbot, width, height):
    page = shown_at(qtbot, width, height)
    panel = page.panel
    left = panel.mapTo(page, panel.rect().topLeft()).x()
    assert left == MARGIN  # the column stays at the page's left margin
    assert panel.width() == MAX_CONTENT_WIDTH
    for field in (panel.system_prompt, panel.inputs["temperature"], panel.speculation):
        right = field.mapTo(page, field.rect().topRight()).x()
        assert right <= MARGIN + MAX_CONTENT_WIDTH, field.accessibleName()


def test_a_narrow_window_gives_the_form_its_whole_width(qtbot):
    page = shown_at(qtbot, 420, 600)
    assert page.panel.width() == 420 - 2 * MARGIN
