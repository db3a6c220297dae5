"""The rotating log file: levels, rotation, and conversation text kept out unless debug logging is on."""

import logging
import uuid

import pytest

from app.logging_setup import LOG_FILENAME, Private, debug_requested, setup_logging

SECRET = "my bank password is hunter2"


@pytest.fixture
def logger():
    """A logger of its own per test (the root logger belongs to pytest), closed afterwards."""
    log = logging.getLogger(f"hearth-test-{uuid.uuid4().hex}")
    log.propagate = False
    yield log
    for handler in list(log.handlers):
        log.removeHandler(handler)
        handler.close()


def test_private_text_is_redacted_without_debug(tmp_path, logger):
    path = setup_logging(tmp_path, root=logger)
    logger.info("sent a message: %s", Private(SECRET))
    logger.info(Private(SECRET))
    logger.info("reply %(text)s", {"text": Private(SECRET)})
    text = path.read_text()
    assert SECRET not in text
    assert text.count(f"<private: {len(SECRET)} chars>") == 3


def test_debug_logging_keeps_private_text_and_debug_records(tmp_path, logger):
    path = setup_logging(tmp_path, debug=True, root=logger)
    logger.debug("prompt: %s", Private(SECRET))
    assert f"prompt: {SECRET}" in path.read_text()


def test_debug_records_are_dropped_without_debug(tmp_path, logger):
    path = setup_logging(tmp_path, root=logger)
    logger.debug("a detail")
    logger.info("model loaded")
    text = path.read_text()
    assert "a detail" not in text
    assert "INFO" in text and "model loaded" in text


def test_file_rotates_and_keeps_a_bounded_number_of_backups(tmp_path, logger):
    setup_logging(tmp_path, root=logger, max_bytes=2000, backup_count=2)
    for i in range(200):
        logger.info("line %d %s", i, "x" * 40)
    names = sorted(p.name for p in tmp_path.iterdir())
    assert names == [LOG_FILENAME, f"{LOG_FILENAME}.1", f"{LOG_FILENAME}.2"]
    assert all((tmp_path / n).stat().st_size <= 2000 for n in names)
    assert "line 199 " in (tmp_path / LOG_FILENAME).read_text()


def test_a_second_setup_replaces_the_handler_instead_of_doubling_lines(tmp_path, logger):
    setup_logging(tmp_path, root=logger)
    path = setup_logging(tmp_path, root=logger)
    logger.info("once")
    assert path.read_text().count("once") == 1
    assert len(logger.handlers) == 1


def test_creates_the_directory(tmp_path, logger):
    path = setup_logging(tmp_path / "a" / "logs", root=logger)
    logger.warning("hello")
    assert path.parent.is_dir() and "hello" in path.read_text()


@pytest.mark.parametrize(("value", "expected"), [("", False), ("0", False), ("1", True), ("yes", True)])
def test_debug_requested_reads_the_environment(value, expected):
    assert debug_requested({"HEARTH_DEBUG": value}) is expected
    assert debug_requested({}) is False
