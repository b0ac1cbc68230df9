"""Runner modes and execution kinds, named as serving engines name them."""
from __future__ import annotations

import enum


class ForwardMode(enum.Enum):
    DECODE = "decode"
    EXTEND = "extend"
    TARGET_VERIFY = "target_verify"
    DRAFT_EXTEND_V2 = "draft_extend_v2"

    def is_decode(self) -> bool:
        return self is ForwardMode.DECODE

    def is_extend(self) -> bool:
        return self is ForwardMode.EXTEND

    def is_target_verify(self) -> bool:
        return self is ForwardMode.TARGET_VERIFY

    def is_draft_extend_v2(self) -> bool:
        return self is ForwardMode.DRAFT_EXTEND_V2

    def has_fixed_tokens_per_request(self) -> bool:
        """Modes whose graphs are captured per batch-size bucket."""
        return self is not ForwardMode.EXTEND


class Exec(enum.Enum):
    EAGER = "eager"
    GRAPH = "graph"


MODES = tuple(ForwardMode)
EXECS = tuple(Exec)


def parse_mode(name: str) -> ForwardMode:
    try:
        return ForwardMode(name.lower())
    except ValueError:
        raise ValueError(f"unknown mode {name!r}; known: {[m.value for m in MODES]}") from None


def parse_exec(name: str) -> Exec:
    try:
        return Exec(name.lower())
    except ValueError:
        raise ValueError(f"unknown exec {name!r}; known: {[e.value for e in EXECS]}") from None
