"""A parser for protobuf *text format* (Caffe's ``.prototxt``), with no schema and no protobuf compiler.

The text format is a sequence of fields: ``name: value`` for scalars and ``name { ... }`` (or
``name: { ... }``, ``name < ... >``) for nested messages. A field may repeat; ``name: [a, b]`` is list
shorthand. Scalars are numbers, quoted strings (adjacent strings concatenate, C escapes apply), and bare
words (enum values such as ``MAX``; ``true``/``false`` become booleans, ``inf``/``nan`` floats). ``#``
starts a comment that runs to the end of the line; ``,`` and ``;`` may separate fields.

Without the schema nothing says whether a field is repeated, so every field keeps a list of its values
in order; ``Message.get`` reads the last one (protobuf's rule for a singular field given twice).
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

from hetflow.errors import ModelLoadError

Scalar = int | float | str | bool

_TOKEN = re.compile(
    r"""
    (?P<space>[ \t\r\f\v]+|\n)
  | (?P<comment>\#[^\n]*)
  | (?P<string>"(?:[^"\\\n]|\\.)*"|'(?:[^'\\\n]|\\.)*')
  | (?P<number>[-+]?(?:0[xX][0-9a-fA-F]+|(?:\d+\.?\d*|\.\d+)(?:[eE][-+]?\d+)?)[fF]?)
  | (?P<word>[A-Za-z_][A-Za-z0-9_.]*)
  | (?P<punct>[{}<>\[\]:,;-])
    """,
    re.VERBOSE,
)
_ESCAPES = {"n": "\n", "t": "\t", "r": "\r", "a": "\a", "b": "\b", "f": "\f", "v": "\v",
            "\\": "\\", "'": "'", '"': '"', "?": "?"}
_CLOSING = {"{": "}", "<": ">"}


@dataclass
class Message:
    """One text-format message: each field name maps to the list of its values, in file order.

    Values are scalars (int, float, str, bool) or nested Messages.
    """

    fields: dict[str, list[Any]] = field(default_factory=dict)

    def add(self, name: str, value: Any) -> None:
        self.fields.setdefault(name, []).append(value)

    def __contains__(self, name: str) -> bool:
        return name in self.fields

    def all(self, name: str) -> list[Any]:
        """Every value of a (repeated) field; empty when absent."""
        return list(self.fields.get(name, ()))

    def get(self, name: str, default: Any = None) -> Any:
        """The last value of a field, or ``default`` when absent."""
        values = self.fields.get(name)
        return values[-1] if values else default

    def message(self, name: str) -> Message:
        """The last nested message called ``name``; an empty one when absent (all defaults)."""
        value = self.get(name)
        if value is None:
            return Message()
        if not isinstance(value, Message):
            raise ValueError(f"field '{name}' is a scalar ({value!r}), not a message")
        return value

    def to_dict(self) -> dict[str, Any]:
        """Plain nested dicts: a field seen once maps to its value, a repeated one to a list."""
        def plain(value: Any) -> Any:
            return value.to_dict() if isinstance(value, Message) else value

        return {
            name: plain(values[0]) if len(values) == 1 else [plain(v) for v in values]
            for name, values in self.fields.items()
        }


@dataclass(frozen=True)
class _Token:
    kind: str
    text: str
    line: int
    column: int


def parse_prototxt(text: str, where: str = "prototxt") -> Message:
    """Parse protobuf text format into a Message tree.

    Args:
        text: the file's contents.
        where: the file name for error messages.

    Raises:
        ModelLoadError: on a syntax error, naming the line and column.
    """
    return _Parser(list(_tokens(text, where)), where).parse()


def _tokens(text: str, where: str) -> Iterator[_Token]:
    line, line_start, pos = 1, 0, 0
    while pos < len(text):
        match = _TOKEN.match(text, pos)
        if match is None:
            raise ModelLoadError(
                f"{where}:{line}:{pos - line_start + 1}: unexpected character {text[pos]!r}"
            )
        kind = match.lastgroup or ""
        if kind not in ("space", "comment"):
            yield _Token(kind, match.group(), line, pos - line_start + 1)
        if match.group() == "\n":
            line, line_start = line + 1, match.end()
        pos = match.end()


class _Parser:
    """Recursive descent over the token list (one method per grammar rule)."""

    def __init__(self, tokens: list[_Token], where: str):
        self._tokens = tokens
        self._pos = 0
        self._where = where

    def parse(self) -> Message:
        message = self._fields(closing=None)
        return message

    # -- helpers -------------------------------------------------------------------------------
    def _peek(self) -> _Token | None:
        return self._tokens[self._pos] if self._pos < len(self._tokens) else None

    def _next(self, expected: str) -> _Token:
        token = self._peek()
        if token is None:
            raise ModelLoadError(f"{self._where}: unexpected end of file; expected {expected}")
        self._pos += 1
        return token

    def _error(self, token: _Token, expected: str) -> ModelLoadError:
        return ModelLoadError(
            f"{self._where}:{token.line}:{token.column}: expected {expected}, found '{token.text}'"
        )

    def _accept(self, text: str) -> bool:
        token = self._peek()
        if token is not None and token.kind == "punct" and token.text == text:
            self._pos += 1
            return True
        return False

    # -- grammar -------------------------------------------------------------------------------
    def _fields(self, closing: str | None) -> Message:
        message = Message()
        while True:
            token = self._peek()
            if token is None:
                if closing is not None:
                    raise ModelLoadError(f"{self._where}: unexpected end of file; expected '{closing}'")
                return message
            if token.kind == "punct" and token.text == closing:
                self._pos += 1
                return message
            if token.kind != "word":
                raise self._error(token, "a field name" if closing is None else f"a field name or '{closing}'")
            self._pos += 1
            self._field_value(token.text, message)
            self._accept(",") or self._accept(";")

    def _field_value(self, name: str, message: Message) -> None:
        colon = self._accept(":")
        token = self._next(f"a value for '{name}'")
        if token.kind == "punct" and token.text in _CLOSING:
            message.add(name, self._fields(_CLOSING[token.text]))
        elif not colon:
            raise self._error(token, f"':' or '{{' after field name '{name}'")
        elif token.kind == "punct" and token.text == "[":
            self._list(name, message)
        else:
            message.add(name, self._scalar(token))

    def _list(self, name: str, message: Message) -> None:
        if self._accept("]"):
            return
        while True:
            token = self._next(f"a value in the list of '{name}'")
            if token.kind == "punct" and token.text in _CLOSING:
                message.add(name, self._fields(_CLOSING[token.text]))
            else:
                message.add(name, self._scalar(token))
            if self._accept("]"):
                return
            if not self._accept(","):
                raise self._error(self._next("',' or ']'"), "',' or ']'")

    def _scalar(self, token: _Token) -> Scalar:
        if token.kind == "string":
            text = _unquote(token.text)
            # Adjacent string literals concatenate, as in C.
            while (following := self._peek()) is not None and following.kind == "string":
                self._pos += 1
                text += _unquote(following.text)
            return text
        if token.kind == "number":
            return _number(token.text)
        if token.kind == "punct" and token.text == "-":
            word = self._next("a number after '-'")
            if word.kind == "word" and word.text.lower() in ("inf", "infinity", "nan"):
                return -_number(word.text)
            raise self._error(word, "a number after '-'")
        if token.kind == "word":
            lowered = token.text.lower()
            if token.text in ("true", "True", "t"):
                return True
            if token.text in ("false", "False", "f"):
                return False
            if lowered in ("inf", "infinity", "nan"):
                return _number(token.text)
            return token.text
        raise self._error(token, "a value")


def _number(text: str) -> int | float:
    lowered = text.lower()
    if lowered in ("inf", "infinity"):
        return float("inf")
    if lowered == "nan":
        return float("nan")
    if re.fullmatch(r"[-+]?0[xX][0-9a-fA-F]+", text):
        return int(text, 16)
    if re.fullmatch(r"[-+]?\d+", text):
        return int(text)
    return float(text.rstrip("fF"))


def _unquote(literal: str) -> str:
    body = literal[1:-1]
    out: list[str] = []
    index = 0
    while index < len(body):
        char = body[index]
        if char != "\\":
            out.append(char)
            index += 1
            continue
        escape = body[index + 1]
        if escape in _ESCAPES:
            out.append(_ESCAPES[escape])
            index += 2
        elif escape in "01234567":
            digits = re.match(r"[0-7]{1,3}", body[index + 1:])
            assert digits is not None
            out.append(chr(int(digits.group(), 8)))
            index += 1 + len(digits.group())
        elif escape in "xX":
            digits = re.match(r"[0-9a-fA-F]{1,2}", body[index + 2:])
            out.append(chr(int(digits.group(), 16)) if digits else escape)
            index += 2 + (len(digits.group()) if digits else 0)
        else:
            out.append(escape)
            index += 2
    return "".join(out)
