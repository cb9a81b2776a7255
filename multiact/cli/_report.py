"""Plain-text tables and an optional progress bar for the command-line tools.

tqdm is optional, and drawn only on a terminal: without it, or when stderr is
a file or a pipe (a log, CI), a line of text every few seconds says how far a
long run has got, with no carriage-return frames; on stderr so that stdout stays
clean.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import Any, TextIO, TypeVar

T = TypeVar("T")


def table(rows: Sequence[Sequence[Any]], header: Sequence[str], align: str | None = None) -> str:
    """A fixed-width table; `align` has one 'l' or 'r' per column (default: text left, numbers right)."""
    cells = [[str(c) for c in header]] + [["" if c is None else str(c) for c in r] for r in rows]
    width = [max(len(r[i]) for r in cells) for i in range(len(header))]
    if align is None:
        align = "".join(
            "r" if rows and all(isinstance(r[i], (int, float)) or _numeric(str(r[i])) for r in rows) else "l"
            for i in range(len(header))
        )

    def line(r: list[str]) -> str:
        parts = (c.rjust(w) if a == "r" else c.ljust(w) for c, w, a in zip(r, width, align, strict=True))
        return "  ".join(parts).rstrip()

    rule = "  ".join("-" * w for w in width)
    return "\n".join([line(cells[0]), rule, *(line(r) for r in cells[1:])])


def _numeric(s: str) -> bool:
    s = s.strip().rstrip("x%")
    if s in ("", "-", "inf", "nan"):
        return True
    try:
        float(s)
    except ValueError:
        return False
    return True


def progress(
    items: Iterable[T], total: int, desc: str, enabled: bool = True, stream: TextIO | None = None
) -> Iterator[T]:
    """Iterate `items` with a progress bar (tqdm when installed and `stream` is a terminal, else a text
    line every ~5 s)."""
    stream = stream or sys.stderr
    if not enabled:
        yield from items
        return
    tqdm = None
    if _is_terminal(stream):
        try:
            from tqdm import tqdm
        except ImportError:
            pass
    if tqdm is not None:
        with tqdm(total=total, desc=desc, file=stream, leave=False, dynamic_ncols=True) as bar:
            for item in items:
                yield item
                bar.update(1)
        return
    start = last = time.monotonic()
    for i, item in enumerate(items, 1):
        yield item
        now = time.monotonic()
        if now - last > 5 or i == total:
            print(f"{desc}: {i}/{total} ({now - start:.0f} s)", file=stream, flush=True)
            last = now


def _is_terminal(stream: Any) -> bool:
    try:
        return bool(stream.isatty())
    except (AttributeError, ValueError):  # no isatty, or a closed stream
        return False


def fmt(v: float | None, digits: int = 3) -> str:
    """A number in a few significant digits; '-' for missing."""
    if v is None:
        return "-"
    if v != v:
        return "nan"
    if v in (float("inf"), float("-inf")):
        return "inf" if v > 0 else "-inf"
    if v == 0:
        return "0"
    if abs(v) >= 10 ** digits:
        return f"{v:.0f}"
    return f"{v:.{digits}g}"


def worst_table(rows_: Sequence[Any], fields: Callable[[Any], tuple[str, str, str, float]],
                cell: Callable[[Any], str]) -> str:
    """A README table: per op (and kernel key) and direction (forward / backward / from y) the row with the
    largest error over every ISA, dy and input, shown as cell(row); fields(row) is (op, case, direction, ulp)."""
    best: dict[tuple[str, str], Any] = {}
    for r in rows_:
        op, case, direction, ulp = fields(r)
        key = (op if case in ("defaults", "axis=0") else f"{op} ({case})", direction.split()[0])
        if key not in best or ulp > fields(best[key])[3]:
            best[key] = r
    lines = ["| op | forward | backward | from y |", "| --- | --- | --- | --- |"]
    for label in dict.fromkeys(label for label, _ in best):
        cells = [cell(best[(label, d)]) if (label, d) in best else "-" for d in ("forward", "backward", "backward_y")]
        lines.append(f"| {label} | " + " | ".join(cells) + " |")
    return "\n".join(lines)
