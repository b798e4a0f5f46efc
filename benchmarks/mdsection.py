"""Replace one marked section of a Markdown file, so each benchmark owns its own table."""

from __future__ import annotations

from pathlib import Path


def write_section(path: Path, name: str, body: str) -> None:
    """Put ``body`` between ``<!-- NAME:begin -->`` and ``<!-- NAME:end -->`` in ``path``.

    The section is appended (and the file created) if the markers are missing;
    everything outside them is left as it was.
    """
    begin, end = f"<!-- {name}:begin -->", f"<!-- {name}:end -->"
    text = path.read_text(encoding="utf-8") if path.exists() else "# Benchmarks\n"
    block = f"{begin}\n{body}\n{end}"
    if begin in text and end in text:
        head, rest = text.split(begin, 1)
        text = head + block + rest.split(end, 1)[1]
    else:
        text = text.rstrip("\n") + "\n\n" + block + "\n"
    path.write_text(text, encoding="utf-8")
