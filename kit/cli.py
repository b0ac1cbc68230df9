"""What the command lines share: errors are one line, `prog: error: problem; fix`, with exit
code 2 for a usage error (a bad option or path) and 1 for anything else. Torch-free."""
from __future__ import annotations

import argparse
import sys

USAGE, FAILED = 2, 1


class Parser(argparse.ArgumentParser):
    """argparse, with its usage errors on one line (the usage itself is under --help)."""

    def error(self, message):
        self.exit(USAGE, f"{self.prog}: error: {message} (see {self.prog} --help)\n")


def fail(prog: str, message: str, code: int = USAGE) -> int:
    print(f"{prog}: error: {message}", file=sys.stderr)
    return code
