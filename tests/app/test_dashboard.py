"""The dashboard page and the status strip in the real window: live updates, agreement with the OS, pausing, CSV."""

import csv
import dataclasses
import re

import pytest
from PySide6.QtCore import Qt

from app.telemetry import format_bytes
from app.builtin_model import BUILTIN_MODEL_NAME

from . import os_memory
from .fake_engine import FakeFactory, FakeModel

pytestmark = pytest.mark.gui

UNITS = {"B": 1, "KB": 1e3, "MB": 1e6, "GB": 1e9}


def configure(session, **changes):
    c = session.controller
    c.update_settings(dataclasses.replace(c.settings(), **changes))


def wait_for_model(qtbot, session, timeout=120000):
    qtbot.waitUntil(lambda: bool(session.controller.model_info), timeout=timeout)


def shown_bytes(text: str, label: str) -> float:
    """The byte count shown after ``label`` in a legend or strip text, e.g. 'Hearth 302 MB' -> 302e6."""
    value, unit = re.search(rf"{label} ([\d.,]+) (B|KB|MB|GB)", text).groups()
    return float(value.replace(",", "")) * UNITS[unit]


def decode_chart(session):
    return session.window.dashboard.charts["decode"][1]


def chart_values(chart, index=0):
    return [p.y() for p in chart.series[index].points()]


@pytest.mark.slow
def test_the_dashboard_follows_a_real_generation(small_model, qtbot, make_session):
    session = make_session(model=small_model)
    # plain decoding, long enough (several seconds) that the 1 Hz redraws see it streaming
    configure(session, max_tokens=600, temperature=0.0, speculation="off")
    wait_for_model(qtbot, session)
    window, telemetry = session.window, session.telemetry
    window.show_page("dashboard")
    qtbot.waitUntil(lambda: telemetry.system is not None and telemetry.engine.kv is not None, timeout=10000)
    kv_before = telemetry.engine.kv.used_positions
    ticks = []  # what the page showed at each of its redraws

    def on_tick(_sample):
        cards = window.dashboard.cards
        ticks.append((telemetry.engine.phase, telemetry.decode_tps(), max(chart_values(decode_chart(session)),
                      default=0.0), cards["decode"].legend.text(), window.status_strip.speed.text()))

    telemetry.system_sampled.connect(on_tick)
    engine_samples = []
    telemetry.engine_sampled.connect(engine_samples.append)
    with qtbot.waitSignal(session.controller.reply_finished, timeout=300000) as finished:
        session.controller.send("Write a long story about a lighthouse keeper who finds a message in a bottle.")
    stats = finished.args[1]
    assert stats["generated_tokens"] > 40 and stats["time_to_first_token_s"] > 0
    decoding = [t for t in ticks if t[0] == "decode" and t[1] > 0]
    assert decoding, ticks  # at least one redraw while tokens streamed
    assert any(chart_max > 0 and "tok/s ·" in legend and "tok/s" in strip for _, _, chart_max, legend, strip in decoding)
    streaming = [e for e in engine_samples if e.phase == "decode"]
    assert len({e.kv.used_positions for e in streaming}) > 1 and len({e.generated_tokens for e in streaming}) > 1
    # idle again: the rate drops to 0 and the chart's line ends at 0
    assert telemetry.engine.phase == "idle" and telemetry.decode_tps() == 0.0
    qtbot.waitUntil(lambda: chart_values(decode_chart(session))[-1:] == [0.0], timeout=10000)
    assert "idle" in window.status_strip.speed.text() and "last answer" in window.dashboard.cards["decode"].legend.text()
    # the KV cache grew by the answer, and its bar and the recent answers table show it
    kv = telemetry.engine.kv
    assert kv.used_positions >= kv_before + stats["generated_tokens"] - 1
    assert f"{kv.used_positions:,} of {kv.max_positions:,} positions" in window.dashboard.memory_view.kv_text.text()
    table = window.dashboard.table
    assert table.rowCount() >= 1 and table.item(0, 5).text() == f"{stats['generated_tokens']:,}"


def test_memory_numbers_shown_agree_with_the_operating_system(qtbot, make_session):
    session = make_session(engine_factory=FakeFactory(FakeModel()))
    wait_for_model(qtbot, session, timeout=20000)
    session.window.show_page("dashboard")
    qtbot.waitUntil(lambda: session.telemetry.system is not None, timeout=10000)
    cards, strip = session.window.dashboard.cards, session.window.status_strip
    rss, available = os_memory.process_rss_bytes(), os_memory.available_bytes()  # not psutil, which the app reads
    assert shown_bytes(cards["process"].legend.text(), "Hearth") == pytest.approx(rss, rel=0.05)
    assert shown_bytes(cards["system"].legend.text(), "available") == pytest.approx(available, rel=0.05)
    assert shown_bytes(strip.memory.text(), "Hearth") == pytest.approx(rss, rel=0.05)
    assert f"{format_bytes(os_memory.total_bytes())} free" in strip.memory.text()
    breakdown = session.telemetry.breakdown()
    assert breakdown.weights_bytes == 1_000_000 and breakdown.other_bytes > 0
    assert "weights 1 MB" in session.window.dashboard.memory_view.process_text.text()


def test_a_hidden_dashboard_draws_nothing_and_a_hidden_window_samples_nothing(qtbot, make_session):
    session = make_session(engine_factory=FakeFactory(FakeModel()))
    window, telemetry = session.window, session.telemetry
    chart = decode_chart(session)
    window.show_page("dashboard")
    assert telemetry.interval_s == 1.0
    start = telemetry.samples_taken
    qtbot.waitUntil(lambda: telemetry.samples_taken >= start + 2 and chart.renders >= 2, timeout=15000)
    window.show_page("chat")
    assert telemetry.interval_s == 5.0  # only the status strip watches now
    renders = chart.renders
    qtbot.wait(3000)
    assert chart.renders == renders
    window.hide()
    assert telemetry.interval_s is None
    taken = telemetry.samples_taken
    qtbot.wait(3000)
    assert telemetry.samples_taken == taken and chart.renders == renders
    window.show()
    qtbot.waitUntil(lambda: telemetry.samples_taken > taken, timeout=10000)


def test_recent_answers_are_listed_and_exported_as_csv(qtbot, make_session, tmp_path):
    session = make_session(engine_factory=FakeFactory(FakeModel(["Hi", " there"], token_s=0.01)))
    c = session.controller
    for text in ("one", "two"):
        with qtbot.waitSignal(c.reply_finished, timeout=20000):
            c.send(text)
    dashboard = session.window.dashboard
    session.window.show_page("dashboard")
    assert dashboard.table.rowCount() == 2 and dashboard.table.item(0, 1).text() == "one"
    with qtbot.waitSignal(c.reply_finished, timeout=20000):
        c.send("three")  # the table follows new answers while shown
    assert dashboard.table.rowCount() == 3
    dashboard.export_to(str(tmp_path / "answers.csv"))
    rows = list(csv.DictReader((tmp_path / "answers.csv").read_text(encoding="utf-8").splitlines()))
    assert len(rows) == 3 and rows[0]["generated_tokens"] == "2"
    assert rows[0]["model"] == BUILTIN_MODEL_NAME  # the display name of the (built-in) model it ran on
    assert float(rows[0]["time_to_first_token_s"]) >= 0 and dashboard.export_status.text().startswith("Saved 3")


def test_the_context_warning_appears_as_the_conversation_fills(qtbot, make_session):
    session = make_session(engine_factory=FakeFactory(FakeModel(["x"] * 40, n_ctx=60)))
    session.window.show_page("dashboard")
    view = session.window.dashboard.memory_view
    with qtbot.waitSignal(session.controller.reply_finished, timeout=20000):
        session.controller.send("fill it")
    qtbot.waitUntil(lambda: "positions used" in view.kv_text.text() and view.warning.isVisible(), timeout=10000)
    assert "50 of 60 positions" in view.kv_text.text() and "83%" in view.warning.text()


def test_the_status_strip_names_the_model_and_opens_the_dashboard(qtbot, make_session):
    session = make_session(engine_factory=FakeFactory(FakeModel()))
    wait_for_model(qtbot, session, timeout=20000)
    strip, window = session.window.status_strip, session.window
    assert strip.model.text().startswith("fake · ") and "idle" in strip.speed.text()
    assert "thermal" in strip.thermal.text()
    qtbot.mouseClick(strip, Qt.MouseButton.LeftButton)
    assert window.stack.currentWidget() is window.dashboard and window.nav_buttons["dashboard"].isChecked()


def test_a_narrow_window_keeps_the_status_message_and_reflows_the_cards(qtbot, make_session):
    session = make_session(engine_factory=FakeFactory(FakeModel()))
    wait_for_model(qtbot, session, timeout=20000)
    window, strip = session.window, session.window.status_strip
    window.show_page("dashboard")
    qtbot.waitUntil(lambda: strip.memory.text() != "", timeout=10000)
    window.resize(1400, 800)
    qtbot.waitUntil(lambda: strip.model.isVisible() and window.dashboard.columns == 4, timeout=5000)
    window.resize(720, 480)
    qtbot.waitUntil(lambda: not strip.model.isVisible() and window.dashboard.columns == 2, timeout=5000)
    assert strip.speed.isVisible() and strip.width() <= window.width() - 280


def test_the_thermal_mode_is_chosen_on_the_dashboard_and_its_decisions_are_explained(qtbot, make_session):
    model = FakeModel(["a", "b"])
    session = make_session(engine_factory=FakeFactory(model))
    wait_for_model(qtbot, session, timeout=20000)
    window, host = session.window, session.host
    window.show_page("dashboard")
    box = window.dashboard.mode_box
    assert box.currentData() == "balanced" and box.isEnabled()
    box.setCurrentIndex(box.findData("cool"))
    assert session.controller.thermal_mode() == "cool" and session.store.setting("thermal_mode") == "cool"
    with qtbot.waitSignal(host.thermal_decided, timeout=20000, check_params_cb=lambda d: d.mode.value == "cool"):
        with qtbot.waitSignal(session.controller.reply_finished, timeout=20000):
            session.controller.send("hi")
    assert host.thermal.policy.mode.value == "cool"
    qtbot.waitUntil(lambda: "mode set to cool" in window.dashboard.cards["limits"].toolTip(), timeout=10000)
    assert "Cool mode" in window.dashboard.cards["limits"].toolTip()
    # the choice is the app's, not the window's: a new session on the same data starts in it
    session.close()
    again = make_session(engine_factory=FakeFactory(FakeModel()))
    assert again.window.dashboard.mode_box.currentData() == "cool"
