"""What a program says of itself costs a process start to learn (QEMU's
version, whether it loads a plugin): each answer is kept for this process
and for these files as they are, so a file replaced or rewritten is asked
again. The processes a verb forks (the creates of forks made at once)
inherit what it learnt."""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import TypeVar, cast

T = TypeVar("T")
_answers: dict[tuple[object, ...], object] = {}


def once(question: str, paths: tuple[str, ...], ask: Callable[[], T]) -> T | None:
    """ask()'s answer about these files, asked once; None where one is gone."""
    try:
        key: tuple[object, ...] = (question, *((st.st_dev, st.st_ino, st.st_mtime_ns)
                                               for st in map(os.stat, paths)))
    except OSError:
        return None
    if key not in _answers:
        _answers[key] = ask()
    return cast(T, _answers[key])
