"""The filter text syntax: a small Python-like boolean expression, read with `ast` and never evaluated.

`read_filter_text` turns ``market == "US" and day >= 20260101`` into the raw
tree `detload._filters.canonical` also builds from the equivalent pyarrow expression or
DNF list, so every spelling of one filter gets one canonical form.
"""

from __future__ import annotations

import ast
import datetime as dt
import decimal
import re
from typing import Any

import numpy as np
import pyarrow as pa

from ..errors import OptionError

__all__ = ["FILTER_HELP", "TEXT_SYNTAX", "TextLiteral", "check_text", "read_filter_text", "text_literal_hint"]

TEXT_SYNTAX = (
    "COLUMN OP LITERAL with OP one of == != < <= > >= (the literal may come first; a chain such as "
    "20260101 <= day < 20260201 means (20260101 <= day) and (day < 20260201)); "
    "COLUMN in (LITERAL, ...) and COLUMN not in (...); COLUMN is None and COLUMN is not None; "
    "combined with and, or, not or &, |, ~, and parentheses. "
    "A COLUMN is a name, or col(\"any name\"); a LITERAL is an int, float, str, bytes, True, False "
    "(None only in an in-list), date(\"YYYY-MM-DD\"), timestamp(\"YYYY-MM-DDTHH:MM:SS[.fff][Z|+HH:MM]\"), "
    "decimal(\"1.50\") or float(\"inf\")"
)

#: For a command line's --filter help: both forms it takes, told apart by the first character.
FILTER_HELP = (
    'a filter: an expression such as \'market == "US" and day >= 20260101\' (see docs/filters.md), '
    'or JSON: a DNF list such as \'[["market", "==", "US"]]\' or a canonical filter object; '
    "text starting with [ or { is JSON"
)

_CMP = {ast.Eq: "==", ast.NotEq: "!=", ast.Lt: "<", ast.LtE: "<=", ast.Gt: ">", ast.GtE: ">="}
_REFUSED = {
    ast.Attribute: "attribute access", ast.Subscript: "a subscript", ast.Lambda: "a lambda",
    ast.NamedExpr: "an assignment expression (:=)", ast.IfExp: "a conditional expression (x if c else y)",
    ast.ListComp: "a comprehension", ast.SetComp: "a comprehension", ast.DictComp: "a comprehension",
    ast.GeneratorExp: "a generator expression", ast.Dict: "a dict", ast.JoinedStr: "an f-string",
    ast.Starred: "a starred expression", ast.Await: "await", ast.Yield: "yield", ast.YieldFrom: "yield",
    ast.Slice: "a slice", ast.Call: "a function call",
}
_ARITH = {
    ast.Add: "+", ast.Sub: "-", ast.Mult: "*", ast.Div: "/", ast.FloorDiv: "//", ast.Mod: "%", ast.Pow: "**",
    ast.MatMult: "@", ast.LShift: "<<", ast.RShift: ">>", ast.BitXor: "^",
}
_LITERAL_HELPERS = ("date", "timestamp", "decimal", "float")
_DATE_RE = re.compile(r"^[0-9]{4}-[0-9]{2}-[0-9]{2}$")
_TS_RE = re.compile(
    r"^(?P<main>[0-9]{4}-[0-9]{2}-[0-9]{2}(?:[T ][0-9]{2}:[0-9]{2}(?::[0-9]{2}(?:\.[0-9]{1,9})?)?)?)"
    r"(?P<zone>Z|[+-][0-9]{2}:[0-9]{2})?$"
)
_LONE_EQUALS = re.compile(r"(?<![=!<>:])=(?!=)")
_UNITS = {"s": 1, "ms": 1_000, "us": 1_000_000, "ns": 1_000_000_000}

Raw = tuple


class TextLiteral:
    """A literal written in filter text, so that a type mismatch can say how to spell it."""

    __slots__ = ("value",)

    def __init__(self, value: Any) -> None:
        self.value = value


def text_literal_hint(t: pa.DataType) -> str:
    """What to write instead, after a text literal did not fit a column of type ``t``."""
    t = t.value_type if pa.types.is_dictionary(t) else t
    if pa.types.is_date(t):
        return '; in filter text write a date as date("2026-01-01")'
    if pa.types.is_timestamp(t):
        zone = "Z" if t.tz is not None else ""
        return f'; in filter text write a timestamp as timestamp("2026-01-01T00:00:00{zone}")'
    if pa.types.is_decimal(t):
        return '; in filter text write a decimal as decimal("1.50") or an int'
    if pa.types.is_binary(t) or pa.types.is_large_binary(t) or pa.types.is_fixed_size_binary(t):
        return '; in filter text write bytes as b"\\x00\\xff"'
    return ""


class _Reader:
    def __init__(self, text: str) -> None:
        self.text = text
        # bytes.splitlines breaks at \n, \r\n and \r only, as the tokenizer does; the
        # offsets ast gives are UTF-8 byte offsets within these lines.
        self.lines = text.encode("utf-8").splitlines(keepends=True)

    def segment(self, node: ast.AST) -> str:
        """The text of ``node`` as written (ast.get_source_segment re-splits the text on every call)."""
        first, last = node.lineno - 1, (node.end_lineno or node.lineno) - 1  # type: ignore[attr-defined]
        start, end = node.col_offset, node.end_col_offset  # type: ignore[attr-defined]
        if first == last:
            raw = self.lines[first][start:end]
        else:
            raw = self.lines[first][start:] + b"".join(self.lines[first + 1:last]) + self.lines[last][:end]
        return raw.decode("utf-8", errors="replace")

    def refuse(self, node: ast.AST | None, what: str) -> OptionError:
        shown = self.text if len(self.text) <= 200 else self.text[:197] + "..."
        where = ""
        if node is not None and hasattr(node, "col_offset"):
            part = self.segment(node)
            if len(part) > 60:
                part = part[:57] + "..."
            line = node.lineno  # type: ignore[attr-defined]
            column = len(self.lines[line - 1][: node.col_offset].decode("utf-8", errors="replace")) + 1  # type: ignore[attr-defined]
            at = f"line {line}, column {column}" if len(self.lines) > 1 else f"column {column}"
            where = f", at {at} ({part!r})"
        return OptionError(f"filter text {shown!r}{where}: {what}; the filter syntax is: {TEXT_SYNTAX}")

    # -- predicates --------------------------------------------------------------

    def predicate(self, node: ast.expr) -> Raw:
        if isinstance(node, ast.BoolOp):
            return _balanced("and" if isinstance(node.op, ast.And) else "or", [self.predicate(v) for v in node.values])
        if isinstance(node, ast.BinOp) and isinstance(node.op, (ast.BitAnd, ast.BitOr)):
            # Flattened by hand: a long chain of & is a deep left-leaning tree.
            op_type = type(node.op)
            parts: list[ast.expr] = []
            stack: list[ast.expr] = [node]
            while stack:
                n = stack.pop()
                if isinstance(n, ast.BinOp) and type(n.op) is op_type:
                    stack += [n.right, n.left]
                else:
                    parts.append(n)
            return _balanced("and" if op_type is ast.BitAnd else "or", [self.predicate(p) for p in parts])
        if isinstance(node, ast.UnaryOp) and isinstance(node.op, (ast.Not, ast.Invert)):
            return ("not", self.predicate(node.operand))
        if isinstance(node, ast.Compare):
            return self.compare(node)
        if isinstance(node, ast.BinOp):
            raise self.refuse(node, f"the operator {_ARITH.get(type(node.op), type(node.op).__name__)} is not supported (no arithmetic in filters)")
        if isinstance(node, ast.Name) or self.is_col_call(node):
            raise self.refuse(node, "a bare column is not a predicate; compare it, e.g. flag == True or x is not None")
        if isinstance(node, (ast.Constant, ast.UnaryOp, ast.Tuple, ast.List, ast.Set)) or self.is_literal_call(node):
            raise self.refuse(node, "a literal alone is not a predicate")
        raise self.refuse(node, f"{self.describe(node)} is not supported")

    def describe(self, node: ast.AST) -> str:
        if isinstance(node, ast.Call):
            name = node.func.id if isinstance(node.func, ast.Name) else self.segment(node.func)
            return (f"a function call {name}(...) (only the helpers col(), "
                    + ", ".join(f"{h}()" for h in _LITERAL_HELPERS) + " are known)")
        return _REFUSED.get(type(node), type(node).__name__)

    def compare(self, node: ast.Compare) -> Raw:
        operands = [node.left, *node.comparators]
        for o in operands:
            if isinstance(o, ast.BinOp) and isinstance(o.op, (ast.BitAnd, ast.BitOr)):
                sym = "&" if isinstance(o.op, ast.BitAnd) else "|"
                raise self.refuse(
                    o, f"{sym} binds tighter than a comparison (a == 1 {sym} b == 2 reads as a == (1 {sym} b) == 2): "
                    f"put each comparison in parentheses, (a == 1) {sym} (b == 2), or use {'and' if sym == '&' else 'or'}"
                )
            if isinstance(o, ast.UnaryOp) and isinstance(o.op, ast.Invert):
                raise self.refuse(o, "~ binds tighter than a comparison: write ~(a == 1), or not a == 1")
        if len(node.ops) == 1 and isinstance(node.ops[0], (ast.In, ast.NotIn)):
            field = self.column(node.left, "the left side of in")
            right = node.comparators[0]
            if not isinstance(right, (ast.Tuple, ast.List, ast.Set)):
                raise self.refuse(right, "in takes a parenthesised list of literals, e.g. segment in (3, 4)")
            values = [None if _is_none(e) else self.literal(e) for e in right.elts]
            isin: Raw = ("isin", field, values, False)
            return ("not", isin) if isinstance(node.ops[0], ast.NotIn) else isin
        if len(node.ops) == 1 and isinstance(node.ops[0], (ast.Is, ast.IsNot)):
            col, other = node.left, node.comparators[0]
            if _is_none(col):  # None is x
                col, other = other, col
            if not _is_none(other):
                raise self.refuse(node, "is and is not compare with None only (x is None); compare values with ==")
            field = self.column(col, "the other side of is")
            return ("is_null" if isinstance(node.ops[0], ast.Is) else "is_valid", field)
        pairs: list[Raw] = []
        for left, op, right in zip(operands, node.ops, operands[1:]):
            if type(op) not in _CMP:
                raise self.refuse(node, "in, not in, is and is not cannot be chained with other comparisons")
            pairs.append(self.pair(node, left, _CMP[type(op)], right))
        return _balanced("and", pairs)

    def pair(self, node: ast.Compare, left: ast.expr, op: str, right: ast.expr) -> Raw:
        lcol, rcol = self.is_column(left), self.is_column(right)
        if lcol and rcol:
            raise self.refuse(node, "compares two columns; a comparison takes a column and a literal")
        if not lcol and not rcol:
            for side in (left, right):
                self.literal_value(side)  # names what is there instead, if it is no literal either
            raise self.refuse(node, "compares no column; a comparison takes a column and a literal")
        col, lit = (left, right) if lcol else (right, left)
        if _is_none(lit):
            name = self.column(col, "")
            raise self.refuse(node, f"a comparison with None is never true; write {name} is None or {name} is not None")
        return ("cmp", op, self.column(col, ""), self.literal(lit), not lcol)

    # -- columns and literals ---------------------------------------------------------

    def is_col_call(self, node: ast.AST) -> bool:
        return isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "col"

    def is_literal_call(self, node: ast.AST) -> bool:
        return isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in _LITERAL_HELPERS

    def is_column(self, node: ast.AST) -> bool:
        return isinstance(node, ast.Name) or self.is_col_call(node)

    def column(self, node: ast.expr, where: str) -> str:
        if isinstance(node, ast.Name):
            written = self.segment(node)
            if written != node.id:  # Python folds identifiers to NFKC: "ﬁ" reads as "fi"
                raise self.refuse(node, f"the name {written!r} reads as {node.id!r} in Python; write col({written!r})")
            return node.id
        if self.is_col_call(node):
            assert isinstance(node, ast.Call)
            return self.string_arg(node, "col")
        what = f"{where} must be a column" if where else "expected a column"
        raise self.refuse(node, what)

    def string_arg(self, node: ast.Call, name: str) -> str:
        if node.keywords or len(node.args) != 1 or not isinstance(node.args[0], ast.Constant) \
                or not isinstance(node.args[0].value, str):
            raise self.refuse(node, f'{name}() takes one string literal, e.g. {name}("...")')
        value: str = node.args[0].value
        return value

    def literal(self, node: ast.expr) -> TextLiteral:
        return TextLiteral(self.literal_value(node))

    def literal_value(self, node: ast.expr) -> Any:
        if isinstance(node, ast.Constant):
            v = node.value
            if v is None:
                raise self.refuse(node, "None is a literal only in an in-list; test nulls with is None")
            if isinstance(v, (bool, int, float, str, bytes)):
                return v
            raise self.refuse(node, f"a {type(v).__name__} literal is not supported")
        if isinstance(node, ast.UnaryOp) and isinstance(node.op, (ast.USub, ast.UAdd)):
            v = self.literal_value(node.operand)
            if isinstance(v, bool) or not isinstance(v, (int, float, decimal.Decimal)):
                raise self.refuse(node, "a sign applies to numbers only")
            return -v if isinstance(node.op, ast.USub) else v
        if self.is_literal_call(node):
            assert isinstance(node, ast.Call) and isinstance(node.func, ast.Name)
            return self.helper(node, node.func.id, self.string_arg(node, node.func.id))
        if self.is_column(node):
            raise self.refuse(node, "expected a literal, found a column")
        if isinstance(node, (ast.Tuple, ast.List, ast.Set)):
            raise self.refuse(node, "a list of values goes with in, e.g. segment in (3, 4)")
        if isinstance(node, ast.BinOp):
            raise self.refuse(node, f"the operator {_ARITH.get(type(node.op), type(node.op).__name__)} is not supported (no arithmetic in filters)")
        raise self.refuse(node, f"{self.describe(node)} is not supported")

    def helper(self, node: ast.Call, name: str, arg: str) -> Any:
        try:
            if name == "date":
                if not _DATE_RE.match(arg):
                    raise ValueError("write YYYY-MM-DD")
                return dt.date.fromisoformat(arg)
            if name == "timestamp":
                return _timestamp(arg)
            if name == "decimal":
                d = decimal.Decimal(arg)
                if not d.is_finite():
                    raise ValueError("a decimal must be finite")
                return d
            return float(arg)
        except (ValueError, decimal.InvalidOperation) as e:
            raise self.refuse(node, f"{name}({arg!r}) is not a valid {name}: {e}") from None


def _timestamp(text: str) -> Any:
    m = _TS_RE.match(text)
    if not m:
        raise ValueError("write YYYY-MM-DDTHH:MM:SS, optionally with a fraction and Z or +HH:MM")
    value = np.datetime64(m.group("main").replace(" ", "T"))
    unit = np.datetime_data(value.dtype)[0]
    if unit not in _UNITS:  # a date or minutes: counted in seconds
        value, unit = value.astype("datetime64[s]"), "s"
    zone = m.group("zone")
    if zone is None:
        return value
    count = int(value.astype(np.int64))
    if zone != "Z":
        sign = 1 if zone[0] == "+" else -1
        count -= sign * (int(zone[1:3]) * 3600 + int(zone[4:6]) * 60) * _UNITS[unit]
    return pa.scalar(count, pa.timestamp(unit, "UTC"))


def _is_none(node: ast.AST) -> bool:
    return isinstance(node, ast.Constant) and node.value is None


def _balanced(tag: str, parts: list[Raw]) -> Raw:
    # Balanced, so that a long and/or list does not make a deep tree; the canonical
    # form flattens it back into one n-ary node in the order written.
    if len(parts) == 1:
        return parts[0]
    mid = len(parts) // 2
    return (tag, _balanced(tag, parts[:mid]), _balanced(tag, parts[mid:]))


def check_text(text: str, what: str) -> None:
    """Refuse text that holds a lone surrogate (U+D800 to U+DFFF): it is no character, UTF-8 cannot
    encode it, and on a command line it stands for bytes that were not UTF-8."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as e:
        shown = text if len(text) <= 200 else text[:197] + "..."
        raise OptionError(
            f"{what} {shown!r} holds the lone surrogate {text[e.start]!r} at column {e.start + 1}, which is not "
            "a character and cannot be encoded as UTF-8 (on a command line it comes from bytes that are not "
            "UTF-8); write the filter in valid UTF-8"
        ) from None


def read_filter_text(text: str) -> Raw:
    """Read filter text into a raw tree whose literals are `TextLiteral` (None in an in-list stays None)."""
    check_text(text, "filter text")
    stripped = text.strip()
    reader = _Reader(stripped)
    if not stripped:
        raise OptionError(f"filter text {text!r} is empty; pass no filter to read every row")
    try:
        tree = ast.parse(stripped, mode="eval")
        return reader.predicate(tree.body)
    except SyntaxError as e:
        at = f" at column {e.offset}" if e.offset else ""
        hint = "; comparisons are written ==" if _LONE_EQUALS.search(stripped) else ""
        raise reader.refuse(None, f"not valid syntax ({e.msg}{at}){hint}") from None
    except (RecursionError, MemoryError):
        raise reader.refuse(
            None, "nests too deeply; write long conjunctions with and/or (not chains of &/|) or use a JSON DNF list"
        ) from None
