"""A fast scan of Prometheus text for the few metric families an engine profile reads.

prometheus-client's full parser cost ~2% of the gateway's CPU at 200 req/s, scraping
once a second: this scan matches each line with two regular expressions and keeps only
the samples whose name is wanted, their label text unparsed until a profile asks.
"""

from __future__ import annotations

import re
from collections.abc import Collection, Iterator
from dataclasses import dataclass, field

_SAMPLE_HEAD = re.compile(r"[ \t]*([a-zA-Z_:][a-zA-Z0-9_:]*)[ \t]*")
_LABEL_BLOCK = re.compile(r'\{(?:[^"}]|"(?:[^"\\]|\\.)*")*\}')
_LABEL = re.compile(r'([a-zA-Z_][a-zA-Z0-9_]*)\s*=\s*"((?:[^"\\]|\\.)*)"')


def labels_of(text: str) -> dict[str, str]:
    """The labels of a sample's label text (``a="1",b="x"``), escapes left as they are."""
    return dict(_LABEL.findall(text))


@dataclass
class Samples:
    """The wanted samples of one exposition: name → ``(label text, value)`` pairs."""

    by_name: dict[str, list[tuple[str, float]]] = field(default_factory=dict)

    def __contains__(self, name: object) -> bool:
        return name in self.by_name

    def total(self, name: str, **match: str) -> float | None:
        """The sum of ``name``'s samples whose labels include ``match``; None if it has none
        (or none that match)."""
        if match:
            values = [value for _, value in self.labelled(name, **match)]
        else:
            values = [value for _, value in self.by_name.get(name, ())]
        return sum(values) if values else None

    def first(self, *names: str) -> float | None:
        """The total of the first of ``names`` present (a renamed metric's new name first)."""
        return next((total for name in names if (total := self.total(name)) is not None), None)

    def labelled(self, name: str, **match: str) -> Iterator[tuple[dict[str, str], float]]:
        """``name``'s samples whose labels include ``match``, labels parsed."""
        for text, value in self.by_name.get(name, ()):
            labels = labels_of(text)
            if all(labels.get(key) == wanted for key, wanted in match.items()):
                yield labels, value


def scan(text: str, wanted: Collection[str]) -> Samples:
    """The samples of ``text`` whose name is in ``wanted``.

    A line that is not a sample is skipped; ``ValueError`` if no line is one (a body
    that is not Prometheus text, e.g. an HTML page).
    """
    found = Samples()
    samples = skipped = 0
    for line in text.splitlines():
        sample = _sample(line)
        if sample is None:
            stripped = line.strip()
            skipped += bool(stripped) and not stripped.startswith("#")
            continue
        samples += 1
        name, labels, value = sample
        if name in wanted:
            found.by_name.setdefault(name, []).append((labels, value))
    if samples == 0 and skipped:
        raise ValueError("not Prometheus text")
    return found


def _sample(line: str) -> tuple[str, str, float] | None:
    """``(name, label text, value)`` of a sample line (exemplar and timestamp dropped),
    ``None`` for anything else."""
    head = _SAMPLE_HEAD.match(line)
    if head is None:
        return None
    rest, labels = line[head.end() :], ""
    if rest.startswith("{"):
        block = _LABEL_BLOCK.match(rest)
        if block is None:
            return None
        labels, rest = rest[1 : block.end() - 1], rest[block.end() :]
    fields = rest.split()
    if "#" in fields:  # an OpenMetrics exemplar follows
        fields = fields[: fields.index("#")]
    if not 1 <= len(fields) <= 2:
        return None
    try:
        return head.group(1), labels, float(fields[0])
    except ValueError:
        return None
