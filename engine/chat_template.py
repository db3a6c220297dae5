"""Render a conversation into a model's prompt text with its Jinja chat template, in a hardened sandbox."""

from __future__ import annotations

import contextvars
import datetime
import functools
import json
import re
import string
import time
from collections.abc import Iterator, Mapping
from typing import Any

import jinja2
from jinja2 import nodes
from jinja2.ext import Extension
from jinja2.filters import make_attrgetter
from jinja2.sandbox import ImmutableSandboxedEnvironment
from jinja2.utils import Namespace
from jinja2.visitor import NodeTransformer

from .reasoning import ReasoningProfile, profile_of

MAX_SOURCE_CHARS = 1_000_000  # the largest real chat templates are a few tens of kilobytes
MAX_RANGE = 100_000  # longest range() a template may build
MAX_LOOP_ITERATIONS = 1_000_000  # all loops of one render together; real templates need thousands
MAX_INT_BITS = 10_000  # integers past this only come from arithmetic bombs
PRODUCED_FACTOR = 4  # text produced anywhere (macros, set blocks, output) may reach this multiple of the output cap
_DROPPED_FILTERS = ("pprint", "wordwrap", "urlize")  # unused by chat templates, and their output is hard to bound
_DROPPED_GLOBALS = ("cycler", "joiner", "lipsum")  # unused by chat templates; classic SSTI footholds
_BLOCKED_METHODS = frozenset({"expandtabs", "translate", "maketrans"})  # str methods whose output size is unbounded
_PERCENT_FIELD = re.compile(r"%(?:\([^)]*\))?([-#0 +]*(?:\*|\d+)?(?:\.(?:\*|\d+))?)[a-zA-Z%]")
_PROBE = [{"role": "user", "content": "Hello"}]

CHATML_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' ~ message.role ~ '\\n' ~ (message.content or '') ~ '<|im_end|>\\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)
# Gemma has no system role: system text is folded into the next turn, separated by a blank line.
GEMMA_TEMPLATE = (
    "{{ bos_token }}{% set ns = namespace(system='') %}"
    "{% for message in messages %}"
    "{% if message.role == 'system' %}{% set ns.system = ns.system ~ (message.content or '') ~ '\\n\\n' %}"
    "{% else %}"
    "{{ '<start_of_turn>' ~ ('model' if message.role == 'assistant' else message.role) ~ '\\n' ~ ns.system"
    " ~ ((message.content or '') | trim) ~ '<end_of_turn>\\n' }}{% set ns.system = '' %}"
    "{% endif %}{% endfor %}"
    "{% if ns.system %}{{ '<start_of_turn>user\\n' ~ (ns.system | trim) ~ '<end_of_turn>\\n' }}{% endif %}"
    "{% if add_generation_prompt %}{{ '<start_of_turn>model\\n' }}{% endif %}"
)
LLAMA3_TEMPLATE = (
    "{{ bos_token }}{% for message in messages %}"
    "{{ '<|start_header_id|>' ~ message.role ~ '<|end_header_id|>\\n\\n' ~ ((message.content or '') | trim)"
    " ~ '<|eot_id|>' }}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|start_header_id|>assistant<|end_header_id|>\\n\\n' }}{% endif %}"
)


class TemplateError(ValueError):
    """A chat template failed to compile or render, broke the sandbox's rules or exceeded a limit."""

    def __init__(self, message: Any):
        text = " ".join(str(message).split("\n")).strip()
        super().__init__(text if len(text) <= 500 else text[:497] + "...")


# -- the budget of one render ----------------------------------------------------------------------------

class _RenderBudget:
    """Limits of one render: a deadline in the rendering thread's CPU time, a size cap for every value, loop and
    text allowances. CPU time, not wall-clock time: a render that waits for the GIL or a busy CPU (a server
    rendering eight requests at once beside a decoding model) is not cut short; a template that computes is."""

    def __init__(self, max_chars: int, timeout_s: float):
        self.max_chars = max_chars
        self.timeout_s = timeout_s
        self.deadline = time.thread_time() + timeout_s
        self.iterations_left = MAX_LOOP_ITERATIONS
        self.produced_left = PRODUCED_FACTOR * max_chars
        self.failure: TemplateError | None = None

    def fail(self, message: str) -> None:
        # Remembered, so a limit hit inside code that swallows exceptions still fails the render.
        self.failure = TemplateError(message)
        raise self.failure

    def tick(self) -> None:
        if self.failure is not None:
            raise self.failure
        if time.thread_time() > self.deadline:
            self.fail(f"chat template took longer than its {self.timeout_s:g} s time limit (CPU time)")

    def count_iteration(self) -> None:
        self.iterations_left -= 1
        if self.iterations_left < 0:
            self.fail(f"chat template refused: more than {MAX_LOOP_ITERATIONS} loop iterations")
        self.tick()

    def count_produced(self, n_chars: int) -> None:
        self.produced_left -= n_chars
        if self.produced_left < 0:
            self.fail(f"chat template refused: it produced more than {PRODUCED_FACTOR * self.max_chars} characters")

    def check_size(self, size: int, what: str) -> None:
        if size > self.max_chars:
            self.fail(f"chat template refused: {what} would exceed {self.max_chars} characters")

    def check_value(self, value: Any, what: str) -> None:
        self.check_size(_weight(value, self.max_chars), what)


_active_budget: contextvars.ContextVar[_RenderBudget | None] = contextvars.ContextVar("template_budget", default=None)


def _weight(value: Any, limit: int) -> int:
    """Roughly how many characters ``str(value)`` takes, counted only until the count passes ``limit``.

    Shared references count every time they appear, as they do in the text, but each object is measured once,
    so ``[a, a]`` applied 60 times costs 60 steps; a cycle counts as over the limit.
    """
    if isinstance(value, (str, bytes)):  # the common case, without building the walker
        return len(value)
    memo: dict[int, int] = {}

    def measure(item: Any) -> int:
        if isinstance(item, (str, bytes)):
            return len(item)
        if isinstance(item, bool) or item is None:
            return 5
        if isinstance(item, int):
            return item.bit_length() // 3 + 1
        if isinstance(item, Namespace):
            item = item._Namespace__attrs  # Namespace keeps its attributes in this (name-mangled) dict
        if not isinstance(item, (Mapping, list, tuple, set, frozenset)):
            return 16
        if id(item) in memo:
            return memo[id(item)]
        memo[id(item)] = limit + 1  # still being measured: reaching it again means a cycle
        children = [*item.keys(), *item.values()] if isinstance(item, Mapping) else item
        total = 2 + 2 * len(children)
        for child in children:
            if total > limit:
                break
            total += measure(child)
        memo[id(item)] = total
        return total

    return measure(value)


def _check_int_args(budget: _RenderBudget, args: tuple, kwargs: dict) -> None:
    # No chat template passes a width or count above the output cap; such arguments build huge values in C.
    for value in (*args, *kwargs.values()):
        if isinstance(value, int) and not isinstance(value, bool) and abs(value) > budget.max_chars:
            budget.fail(f"chat template refused: integer argument {value} is larger than {budget.max_chars}")


def _check_format(budget: _RenderBudget, fmt: str, specs: list[str], values: list) -> None:
    """Refuse a str.format / % formatting whose result could exceed the size cap (widths, repeated fields)."""
    widths = [0]
    for run in re.findall(r"\d+", " ".join(specs)):
        if len(run) > 9:
            budget.fail(f"chat template refused: format width {run[:12]}... is too large")
        widths.append(int(run))
    widths += [abs(v) for v in values if isinstance(v, int) and not isinstance(v, bool)]
    if max(widths) > budget.max_chars:
        budget.fail(f"chat template refused: format width {max(widths)} is larger than {budget.max_chars}")
    largest = max((_weight(v, budget.max_chars) for v in values), default=0)
    budget.check_size(len(fmt) + len(specs) * (largest + max(widths)), "a formatted string")


def _format_values(args: Any) -> list:
    if isinstance(args, Mapping):
        return list(args.values())
    return list(args) if isinstance(args, tuple) else [args]


def _check_percent(budget: _RenderBudget, fmt: str | bytes, args: Any) -> None:
    text = fmt.decode("latin-1") if isinstance(fmt, bytes) else fmt
    _check_format(budget, text, _PERCENT_FIELD.findall(text), _format_values(args))


def _check_replace(budget: _RenderBudget, text: Any, old: Any, new: Any, count: Any = -1) -> None:
    if isinstance(text, bytes):
        if not (isinstance(old, bytes) and isinstance(new, bytes)):
            return
    else:  # Jinja's replace filter converts all three to str; str.replace needs them to be str already
        text, old, new = str(text), str(old), str(new)
    n = text.count(old) if old else len(text) + 1
    if isinstance(count, int) and count >= 0:
        n = min(n, count)
    budget.check_size(len(text) + n * (len(new) - len(old)), "the replaced string")


def _check_repeat(budget: _RenderBudget, left: Any, right: Any) -> None:
    for seq, n in ((left, right), (right, left)):
        if isinstance(n, int) and not isinstance(n, bool):
            if isinstance(seq, (str, bytes)):
                budget.check_size(len(seq) * max(n, 0), "a repeated string")
            elif isinstance(seq, (list, tuple)):
                budget.check_size((_weight(seq, budget.max_chars) - 2) * max(n, 0), "a repeated list")
            elif isinstance(seq, int) and not isinstance(seq, bool) \
                    and seq.bit_length() + n.bit_length() > MAX_INT_BITS:
                budget.fail(f"chat template refused: a product of integers over {MAX_INT_BITS} bits")


def _check_power(budget: _RenderBudget, base: Any, exponent: Any) -> None:
    ints = all(isinstance(v, int) and not isinstance(v, bool) for v in (base, exponent))
    if ints and abs(base) > 1 and exponent > 0 and base.bit_length() * exponent > MAX_INT_BITS:
        budget.fail(f"chat template refused: a power of integers over {MAX_INT_BITS} bits")


class _GuardedIterator(Iterator):
    """An iterator that checks the render's deadline and loop allowance at every item, and optionally the total
    size of what it yields (for lazily built values such as ``map`` results)."""

    def __init__(self, iterable: Any, budget: _RenderBudget, track_size: bool):
        self._iterator = iter(iterable)
        self._budget = budget
        self._size_left = budget.max_chars if track_size else None

    def __next__(self) -> Any:
        self._budget.count_iteration()
        item = next(self._iterator)
        if self._size_left is not None:
            self._size_left -= _weight(item, self._budget.max_chars)
            if self._size_left < 0:
                self._budget.fail(f"chat template refused: a sequence would exceed {self._budget.max_chars} characters")
        return item


# -- the sandbox -----------------------------------------------------------------------------------------

class _SandboxEnvironment(ImmutableSandboxedEnvironment):
    """HF's chat-template environment (immutable sandbox, trim/lstrip blocks, loop controls) with resource limits.

    Every place a value can grow is bounded by the output cap: binary operators and calls through the sandbox's
    hooks, filters by wrappers, and list/dict/tuple literals, ``~`` joins, loops and literal text through filters
    the compiler is made to insert (``_GuardTransformer``). The deadline is checked in all of them and between
    output chunks. A single C-level operation cannot be interrupted, which is why sizes are checked *before* an
    operation that could build a huge value, not after.
    """

    intercepted_binops = frozenset({"+", "*", "**", "%"})

    def __init__(self, max_chars: int, timeout_s: float):
        super().__init__(trim_blocks=True, lstrip_blocks=True, finalize=_finalize,
                         extensions=["jinja2.ext.loopcontrols", _GenerationTag])
        self.max_chars, self.timeout_s = max_chars, timeout_s
        for name in _DROPPED_GLOBALS:
            self.globals.pop(name, None)
        self.globals.update(range=self._range, raise_exception=_raise_exception, strftime_now=_strftime_now)
        for name in _DROPPED_FILTERS:
            self.filters.pop(name, None)
        self.filters = {name: self._guard_filter(name, func) for name, func in self.filters.items()}
        self.filters.update(tojson=_tojson, join=_join, _hearth_loop=_loop, _hearth_value=_value, _hearth_text=_text)

    def budget(self) -> _RenderBudget:
        # Outside a render (the compiler folding constants) a fresh budget still enforces the size caps.
        return _active_budget.get() or _RenderBudget(self.max_chars, self.timeout_s)

    def compile_guarded(self, source: str) -> jinja2.Template:
        tree = self.parse(source)
        tree = _GuardTransformer().visit(tree)
        tree.set_environment(self)
        return self.from_string(tree)

    def checked(self, budget: _RenderBudget, value: Any, what: str) -> Any:
        """Return ``value`` after checking its size; lazy iterators come back wrapped so their items are counted."""
        if type(value) in (str, float, bool, type(None)):  # the common cases first: this runs on every operation
            if type(value) is str and len(value) > budget.max_chars:
                budget.check_size(len(value), what)
        elif isinstance(value, int) and not isinstance(value, bool):
            if value.bit_length() > MAX_INT_BITS:
                budget.fail(f"chat template refused: {what} is an integer over {MAX_INT_BITS} bits")
        elif isinstance(value, Iterator) and not isinstance(value, _GuardedIterator):
            return _GuardedIterator(value, budget, track_size=True)
        else:
            budget.check_value(value, what)
        return value

    def _range(self, *args: int) -> range:
        numbers = range(*args)
        if len(numbers) > MAX_RANGE:
            self.budget().fail(f"chat template refused: range of {len(numbers)} items is longer than {MAX_RANGE}")
        return numbers

    def _guard_filter(self, name: str, func: Any) -> Any:
        skip = 1 if getattr(func, "jinja_pass_arg", None) else 0  # context / environment argument first
        precheck = _FILTER_PRECHECKS.get(name)

        @functools.wraps(func)
        def guarded(*args: Any, **kwargs: Any) -> Any:
            budget = self.budget()
            budget.tick()
            _check_int_args(budget, args[skip + 1:], kwargs)
            if precheck is not None:
                precheck(budget, *args[skip:], **kwargs)
            return self.checked(budget, func(*args, **kwargs), f"the result of the {name} filter")

        return guarded

    # -- sandbox hooks ---------------------------------------------------------------------------------
    def call_binop(self, context: jinja2.runtime.Context, operator: str, left: Any, right: Any) -> Any:
        budget = self.budget()
        budget.tick()
        if operator == "*":
            _check_repeat(budget, left, right)
        elif operator == "**":
            _check_power(budget, left, right)
        elif operator == "%" and isinstance(left, (str, bytes)):
            _check_percent(budget, left, right)
        return self.checked(budget, self.binop_table[operator](left, right), f"the result of {operator!r}")

    def call(__self, __context: jinja2.runtime.Context, __obj: Any, *args: Any, **kwargs: Any) -> Any:  # noqa: N805
        budget = __self.budget()
        budget.tick()
        if not __self.is_safe_callable(__obj):
            budget.fail(f"chat template refused: a {type(__obj).__name__!r} object is not safely callable")
        owner = getattr(__obj, "__self__", None)
        if isinstance(owner, (str, bytes, int, float)):
            _check_int_args(budget, args, kwargs)
            if isinstance(owner, (str, bytes)):
                args = _precheck_str_method(budget, owner, getattr(__obj, "__name__", ""), args, kwargs)
        result = __context.call(__obj, *args, **kwargs)
        return __self.checked(budget, result, f"the result of {getattr(__obj, '__name__', 'a call')}")

    def getattr(self, obj: Any, attribute: str) -> Any:
        self._check_name(obj, attribute)
        return super().getattr(obj, attribute)

    def getitem(self, obj: Any, argument: Any) -> Any:
        self._check_name(obj, argument)
        return super().getitem(obj, argument)

    def _check_name(self, obj: Any, name: Any) -> None:
        budget = self.budget()
        budget.tick()
        # Underscore names are the way out of every sandbox (__class__, __globals__, _Namespace__attrs);
        # refuse them outright instead of handing back an Undefined a template could test and ignore.
        if isinstance(name, str) and name.startswith("_") and not (isinstance(obj, Mapping) and name in obj):
            self.unsafe_undefined(obj, name)

    def unsafe_undefined(self, obj: Any, attribute: str) -> jinja2.Undefined:
        self.budget().fail(f"chat template refused: access to {attribute!r} of a {type(obj).__name__!r} object")
        raise AssertionError("unreachable")  # fail() always raises

    def is_safe_attribute(self, obj: Any, attr: str, value: Any) -> bool:
        blocked = isinstance(obj, (str, bytes)) and attr in _BLOCKED_METHODS
        return not blocked and super().is_safe_attribute(obj, attr, value)

    def wrap_str_format(self, value: Any) -> Any:
        wrapper = super().wrap_str_format(value)
        if wrapper is None:
            return None
        fmt, is_format_map = value.__self__, value.__name__ == "format_map"

        def checked_format(*args: Any, **kwargs: Any) -> str:
            values = _format_values(args[0]) if is_format_map and args else [*args, *kwargs.values()]
            specs = [spec or "" for _, field, spec, _ in string.Formatter().parse(fmt) if field is not None]
            _check_format(self.budget(), fmt, specs, values)
            return wrapper(*args, **kwargs)

        return checked_format


def _precheck_str_method(budget: _RenderBudget, owner: str | bytes, name: str, args: tuple, kwargs: dict) -> tuple:
    if name == "replace" and len(args) >= 2:
        _check_replace(budget, owner, *args[:3])
    elif name == "join" and args:
        items, size = [], 0
        for item in args[0] if isinstance(args[0], _GuardedIterator) else _GuardedIterator(args[0], budget, False):
            size += (len(item) if isinstance(item, (str, bytes)) else 0) + (len(owner) if items else 0)
            budget.check_size(size, "the joined string")
            items.append(item)
        args = (items, *args[1:])
    return args


def _check_indent(budget: _RenderBudget, text: Any, width: Any = 4, *args: Any, **kwargs: Any) -> None:
    text = text if isinstance(text, str) else str(text)
    step = len(width) if isinstance(width, str) else width if isinstance(width, int) else 0
    budget.check_size(len(text) + (text.count("\n") + 1) * step, "the indented string")


def _check_format_filter(budget: _RenderBudget, value: Any, *args: Any, **kwargs: Any) -> None:
    if isinstance(value, str):
        _check_percent(budget, value, kwargs or args)


_FILTER_PRECHECKS = {"replace": _check_replace, "indent": _check_indent, "format": _check_format_filter}


class _GuardTransformer(NodeTransformer):
    """Routes loops, list/dict/tuple literals, ``~`` joins and literal text through the budget-checking filters."""

    @staticmethod
    def _wrap(node: nodes.Expr, name: str) -> nodes.Filter:
        return nodes.Filter(node, name, [], [], None, None, lineno=node.lineno)

    def visit_For(self, node: nodes.For) -> nodes.For:
        node = self.generic_visit(node)
        node.iter = self._wrap(node.iter, "_hearth_loop")
        return node

    def visit_List(self, node: nodes.List) -> nodes.Filter:
        return self._wrap(self.generic_visit(node), "_hearth_value")

    visit_Dict = visit_Concat = visit_List

    def visit_Tuple(self, node: nodes.Tuple) -> nodes.Expr:
        node = self.generic_visit(node)
        return self._wrap(node, "_hearth_value") if node.ctx == "load" else node  # not assignment targets

    def visit_Output(self, node: nodes.Output) -> nodes.Output:
        node = self.generic_visit(node)
        node.nodes = [self._wrap(nodes.Const(child.data, lineno=child.lineno), "_hearth_text")
                      if isinstance(child, nodes.TemplateData) else child for child in node.nodes]
        return node


class _GenerationTag(Extension):
    """Accepts HF's ``{% generation %}`` markers (training masks) and renders their body unchanged."""

    tags = {"generation"}

    def parse(self, parser: Any) -> list[nodes.Node]:
        next(parser.stream)
        return parser.parse_statements(("name:endgeneration",), drop_needle=True)


# The internal filters take the context so the compiler never folds them into constants at compile time.
@jinja2.pass_context
def _loop(context: jinja2.runtime.Context, iterable: Any) -> _GuardedIterator:
    if isinstance(iterable, _GuardedIterator):  # already counting its items
        return iterable
    return _GuardedIterator(iterable, context.environment.budget(), track_size=False)


@jinja2.pass_context
def _value(context: jinja2.runtime.Context, value: Any) -> Any:
    return context.environment.checked(context.environment.budget(), value, "a literal")


@jinja2.pass_context
def _text(context: jinja2.runtime.Context, text: str) -> str:
    budget = context.environment.budget()
    budget.tick()
    budget.count_produced(len(text))
    return text


@jinja2.pass_context
def _finalize(context: jinja2.runtime.Context, value: Any) -> str:
    budget = context.environment.budget()
    budget.tick()
    budget.check_value(value, "an expression's text")
    text = str(value)
    budget.count_produced(len(text))
    return text


@jinja2.pass_context
def _tojson(context: jinja2.runtime.Context, value: Any, ensure_ascii: bool = False, indent: Any = None,
            separators: Any = None, sort_keys: bool = False) -> str:
    """HF's ``tojson``: plain ``json.dumps`` (no HTML escaping, non-ASCII kept), built chunk by chunk under the cap."""
    budget = context.environment.budget()
    _check_int_args(budget, (indent,), {})
    encoder = json.JSONEncoder(ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)
    chunks, size = [], 0
    for chunk in encoder.iterencode(value):
        size += len(chunk)
        budget.check_size(size, "the tojson result")
        budget.tick()
        chunks.append(chunk)
    return "".join(chunks)


@jinja2.pass_environment
def _join(environment: _SandboxEnvironment, value: Any, d: str = "", attribute: Any = None) -> str:
    """Jinja's ``join``, built piece by piece under the size cap."""
    budget = environment.budget()
    get = make_attrgetter(environment, attribute) if attribute is not None else None
    pieces, size = [], 0
    for item in _GuardedIterator(value, budget, track_size=False):
        item = get(item) if get is not None else item
        budget.check_value(item, "a joined item")
        pieces.append(str(item))
        size += len(pieces[-1]) + (len(d) if len(pieces) > 1 else 0)
        budget.check_size(size, "the joined string")
    return str(d).join(pieces)


def _raise_exception(message: Any) -> None:
    raise TemplateError(message)


def _strftime_now(fmt: str) -> str:
    return datetime.datetime.now().strftime(fmt)


# -- the public class ------------------------------------------------------------------------------------

class ChatTemplate:
    """A compiled chat template: turns a list of ``{"role", "content"}`` messages into the model's prompt text.

    Templates come from model files and are untrusted: they run in an immutable Jinja2 sandbox with
    underscore attributes refused, every value's size capped at ``max_output_chars`` and ``timeout_s`` of the
    calling thread's CPU time (the render runs there) checked throughout the render. The deadline cannot
    interrupt a single C-level operation (one huge ``str * int``), which is why sizes are checked before those.
    """

    def __init__(self, source: str, *, bos_token: str = "", eos_token: str = "",
                 max_output_chars: int = 1_000_000, timeout_s: float = 2.0):
        if not isinstance(source, str):
            raise TemplateError(f"chat template must be a string, not {type(source).__name__}")
        if len(source) > MAX_SOURCE_CHARS:
            raise TemplateError(f"chat template is {len(source)} characters long, over the {MAX_SOURCE_CHARS} limit")
        if max_output_chars <= 0 or not timeout_s > 0:
            raise ValueError("max_output_chars and timeout_s must be positive")
        self.source, self.bos_token, self.eos_token = source, bos_token, eos_token
        self.max_output_chars, self.timeout_s = max_output_chars, timeout_s
        self._env = _SandboxEnvironment(max_output_chars, timeout_s)
        try:
            self._template = self._env.compile_guarded(source)
        except jinja2.TemplateSyntaxError as e:
            raise TemplateError(f"chat template syntax error on line {e.lineno}: {e.message}") from None
        except RecursionError:
            raise TemplateError("chat template is nested too deeply to compile") from None

    @classmethod
    def for_model(cls, metadata: Mapping[str, Any], bos_token: str, eos_token: str) -> tuple[ChatTemplate, str | None]:
        """The model's own chat template if it works, otherwise a built-in one for its architecture.

        Args:
            metadata: GGUF metadata; reads ``tokenizer.chat_template``, ``general.architecture`` and
                ``tokenizer.ggml.tokens``.
            bos_token: Text of the model's beginning-of-sequence token.
            eos_token: Text of the model's end-of-sequence token.

        Returns:
            The template, and ``None`` when it is the model's own, or else a one-line notice for the user saying
            why and which built-in format is used instead.
        """
        source = metadata.get("tokenizer.chat_template")
        if isinstance(source, str) and source.strip():
            try:
                template = cls(source, bos_token=bos_token, eos_token=eos_token)
                template._probe()
                return template, None
            except TemplateError as e:
                reason = f"The model's chat template could not be used ({e})"
        else:
            reason = "The model file has no chat template"
        vocab = metadata.get("tokenizer.ggml.tokens")
        name, fallback = _fallback_for(str(metadata.get("general.architecture") or ""), () if vocab is None else vocab)
        return cls(fallback, bos_token=bos_token, eos_token=eos_token), f"{reason}; using the built-in {name} format."

    def render(self, messages: list[dict], *, add_generation_prompt: bool = True, tools: Any = None,
               **extra: Any) -> str:
        """Render a conversation into prompt text.

        Args:
            messages: ``[{"role": "system" | "user" | "assistant" | "tool", "content": str, ...}, ...]``.
            add_generation_prompt: End with the header that starts the assistant's reply.
            tools: Tool (function) definitions for templates that support them, as JSON-like dicts.
            **extra: More template variables (``enable_thinking``, ``documents``, ...).

        Returns:
            The prompt text, including ``bos_token`` where the model's format writes it.

        Raises:
            TemplateError: The template raised (``raise_exception``), failed, broke the sandbox's rules, or exceeded
                ``max_output_chars`` or ``timeout_s``.
        """
        variables = {"bos_token": self.bos_token, "eos_token": self.eos_token, **extra, "messages": messages,
                     "tools": tools, "add_generation_prompt": add_generation_prompt}
        budget = _RenderBudget(self.max_output_chars, self.timeout_s)
        token = _active_budget.set(budget)
        try:
            return self._stream(variables, budget)
        except TemplateError:
            raise
        except RecursionError:
            raise TemplateError("chat template failed: it recursed too deeply") from None
        except jinja2.TemplateError as e:
            raise TemplateError(f"chat template failed: {e}") from e
        except Exception as e:  # the template is foreign code: any error is the template's failure
            raise TemplateError(f"chat template failed: {type(e).__name__}: {e}") from e
        finally:
            _active_budget.reset(token)

    def _stream(self, variables: dict, budget: _RenderBudget) -> str:
        chunks, size = [], 0
        for chunk in self._template.generate(variables):
            size += len(chunk)
            if size > self.max_output_chars:
                budget.fail(f"chat template output exceeds {self.max_output_chars} characters")
            budget.tick()
            chunks.append(chunk)
        if budget.failure is not None:
            raise budget.failure
        return "".join(chunks)

    @functools.cached_property
    def reasoning(self) -> ReasoningProfile:
        """How this template handles reasoning: its syntax, its ``enable_thinking`` switch, and whether its
        generation prompt opens the thinking (``engine.reasoning.profile_of``)."""
        return profile_of(self.source, lambda **extra: self.render(_PROBE, add_generation_prompt=True, **extra))

    def _probe(self) -> None:
        if _PROBE[0]["content"] not in self.render(_PROBE, add_generation_prompt=True):
            raise TemplateError("it leaves the conversation out of the prompt")


def _fallback_for(architecture: str, vocab: Any) -> tuple[str, str]:
    """The built-in template for a model without a usable one: (format name, template source)."""
    if architecture.startswith("gemma"):
        return "Gemma", GEMMA_TEMPLATE
    if "<|im_start|>" in vocab:
        return "ChatML", CHATML_TEMPLATE
    if "<|start_header_id|>" in vocab and "<|eot_id|>" in vocab:
        return "Llama 3", LLAMA3_TEMPLATE
    return "ChatML", CHATML_TEMPLATE
