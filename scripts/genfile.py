"""The tail the generators in scripts/ share: write the files they generate, or, checking, name
each one that is out of date and exit 1.

    sys.path.insert(0, str(REPO / "scripts"))   # tests load the generators by file path
    from genfile import write_or_check
    return write_or_check({OUT: text}, check="--check" in argv,
                          stale="{rel} is out of date: run scripts/gen-x.py")

A file is written only when its text changed (an up-to-date file keeps its time stamp).
Messages are format strings: ``{path}`` is the path as given, ``{rel}`` relative to the
repository when it lies inside it.
"""

from __future__ import annotations

import sys
from collections.abc import Mapping
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent


def _rel(path: Path) -> Path:
    try:
        return path.relative_to(REPO)
    except ValueError:
        return path


def write_or_check(outputs: Mapping[Path, str], *, check: bool = False, stale: str = "{rel} is out of date",
                   wrote: str | None = None) -> int:
    """A generator's exit status.  ``outputs``: each file and the text it should hold.  With
    ``check``, nothing is written: ``stale`` is printed to stderr for every file whose text
    differs (or that is missing), and the status is 1 if there was one.  Without, every such
    file is written (``wrote`` printed for each, when given) and the status is 0."""
    out_of_date = [path for path, text in outputs.items()
                   if not path.is_file() or path.read_text() != text]
    if check:
        for path in out_of_date:
            print(stale.format(path=path, rel=_rel(path)), file=sys.stderr)
        return 1 if out_of_date else 0
    for path in out_of_date:
        path.write_text(outputs[path])
        if wrote is not None:
            print(wrote.format(path=path, rel=_rel(path)))
    return 0
