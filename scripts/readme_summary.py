"""Writes the reference summary (did the paper's claims hold, reports/quick/) into README.md,
between its <!-- summary:start --> and <!-- summary:end --> lines, and the GPU lines of README.md and
reports/README.md from each GPU's newest clean-commit campaign (`reporting.gpu_campaign`);
tests/test_summary.py and tests/test_gpu_campaign.py check they agree.

    python scripts/readme_summary.py
"""
from __future__ import annotations

import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from trainopt_core.reporting.gpu_campaign import write_gpu_blocks  # noqa: E402
from trainopt_core.reporting.summary import profile_summary  # noqa: E402

START, END = "<!-- summary:start -->\n", "<!-- summary:end -->"


def main() -> int:
    readme = ROOT / "README.md"
    text = readme.read_text()
    if START not in text or END not in text:
        print(f"README.md has no {START.strip()} ... {END} block", file=sys.stderr)
        return 1
    block = START + profile_summary(ROOT / "reports", "quick") + END
    readme.write_text(re.sub(re.escape(START) + r".*?" + re.escape(END), lambda _: block, text, flags=re.S))
    write_gpu_blocks(ROOT)
    print(f"wrote the summary of reports/quick into {readme}, and the GPU lines into it and reports/README.md")
    return 0


if __name__ == "__main__":
    sys.exit(main())
