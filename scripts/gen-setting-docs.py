#!/usr/bin/env python3
"""Fill the settings quoted in the hand-written docs from the configuration models (`make docs`).

    scripts/gen-setting-docs.py          # rewrite the quoted blocks in README.md and docs/*.md
    scripts/gen-setting-docs.py --check  # exit 1 when one is out of date

A doc that explains a setting quotes it instead of restating it:
`<!-- setting: indicators.state.client_holdover_seconds -->...<!-- /setting -->` holds the
setting's `Field(description=...)`, `<!-- default: PATH -->...<!-- /default -->` its default
("3 s", "85 %"), so a rule's text is written once, in the model
(exporter/run/config_reference.py: `fill`). tests/test_config_reference.py fails while a block
is out of date or names no setting.
"""

from __future__ import annotations

import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "scripts"))

from genfile import write_or_check  # noqa: E402

from exporter.run.config_reference import MARKER, fill  # noqa: E402


def documents() -> list[Path]:
    """The hand-written docs that quote a setting."""
    return [p for p in [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]
            if MARKER.search(p.read_text(encoding="utf-8"))]


def main(argv: list[str]) -> int:
    return write_or_check({p: fill(p.read_text(encoding="utf-8")) for p in documents()}, check="--check" in argv,
                          stale="{rel}: a quoted setting is out of date; run scripts/gen-setting-docs.py (make docs)")


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
