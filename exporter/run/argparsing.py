"""The argument parser of the command lines (the daemon's and ``import``): a flag error in one
line plus a hint, not the whole usage."""

from __future__ import annotations

import argparse
import difflib


class OneLineErrorParser(argparse.ArgumentParser):
    """Flag errors in one line plus a hint (the closest flag, or --help), not the whole usage."""

    def error(self, message: str, hint: str = "") -> None:  # type: ignore[override]
        """Exit 2 with ``message`` and a hint (``hint`` first, when given)."""
        hint = f"{hint} (see {self.prog} --help)" if hint else f"see {self.prog} --help"
        if message.startswith("unrecognized arguments: "):
            flags = [o for a in self._actions for o in a.option_strings if o.startswith("--")]
            for arg in message.split(": ", 1)[1].split():
                close = difflib.get_close_matches(arg.split("=", 1)[0], flags, n=1)
                if close:
                    hint = f"did you mean {close[0]}? ({hint})"
                    break
        self.exit(2, f"{self.prog}: error: {message}\n{self.prog}: {hint}\n")
