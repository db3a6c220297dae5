"""Splitting Markdown into prose and fenced code blocks, including a fence still streaming in."""

from app.markdown_blocks import Block, split_blocks


def test_prose_and_code_alternate():
    md = "Here:\n\n```python\nprint('hi')\nx = 1\n```\n\nDone. Use `x`."
    assert split_blocks(md) == [Block("text", "Here:"), Block("code", "print('hi')\nx = 1", "python"),
                                Block("text", "Done. Use `x`.")]


def test_an_open_fence_runs_to_the_end_while_streaming():
    assert split_blocks("Try\n~~~~\nls -l\n~~~") == [Block("text", "Try"), Block("code", "ls -l\n~~~", "", False)]


def test_a_longer_closing_fence_closes_and_inline_backticks_do_not_open():
    assert split_blocks("```js\na()\n`````\n``` not a fence ```") == [
        Block("code", "a()", "js"), Block("text", "``` not a fence ```")]


def test_empty_and_whitespace_text_is_dropped():
    assert split_blocks("") == []
    assert split_blocks("\n\n```\n\n```\n\n") == [Block("code", "", "")]
