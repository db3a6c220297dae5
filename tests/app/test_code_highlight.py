"""Syntax colours for code blocks: Pygments tokens turned into coloured spans, a style for light and for dark."""

from app.code_highlight import MAX_HIGHLIGHT_CHARS, code_spans

CODE = "def area(r):\n    return 3.14 * r * r  # a circle\n"


def _span_at(spans, offset):
    return next(s for s in spans if s.start <= offset < s.start + s.length)


def test_keywords_strings_and_comments_get_their_own_colours():
    spans = code_spans(CODE, "python", dark=False)
    keyword, number, comment = _span_at(spans, 0), _span_at(spans, CODE.index("3.14")), \
        _span_at(spans, CODE.index("# a"))
    assert CODE[keyword.start:keyword.start + keyword.length] == "def" and keyword.bold
    assert len({keyword.color, number.color, comment.color}) == 3
    assert comment.italic
    assert all(0 <= s.start and s.start + s.length <= len(CODE) for s in spans)
    assert [s.start for s in spans] == sorted(s.start for s in spans)


def test_dark_windows_get_a_dark_style_and_aliases_work():
    light, dark = code_spans(CODE, "py", dark=False), code_spans(CODE, "Python", dark=True)
    assert light and dark and _span_at(light, 0).color != _span_at(dark, 0).color


def test_offsets_hold_after_blank_lines_and_tabs():
    code = "\n\n\tx = 'a'\n"
    string = _span_at(code_spans(code, "python", dark=False), code.index("'a'"))
    assert code[string.start:string.start + string.length] == "'a'"


def test_unknown_or_missing_languages_and_huge_blocks_stay_plain():
    assert code_spans(CODE, "no-such-language", dark=False) == []
    assert code_spans(CODE, "", dark=False) == []
    assert code_spans("x = 1\n" * (MAX_HIGHLIGHT_CHARS // 6 + 1), "python", dark=False) == []
