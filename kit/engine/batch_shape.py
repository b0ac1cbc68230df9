"""What every case line says alike of its batch: per request, the tokens before the step (`prefix`)
and in it (`new`: one count for every request, or one per request)."""
from __future__ import annotations

from typing import Tuple


class BatchShape:
    """Mixed into a case dataclass with `prefix` and `new` fields."""

    @property
    def bs(self) -> int:
        return len(self.prefix)

    @property
    def new_lens(self) -> Tuple[int, ...]:
        return tuple(self.new) if not isinstance(self.new, int) else (self.new,) * self.bs
