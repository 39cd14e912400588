"""Metric names referenced by PromQL expressions (for checking dashboards and alert rules)."""

from __future__ import annotations

import re

KEYWORDS = {"by", "without", "on", "ignoring", "group_left", "group_right", "bool", "and", "or", "unless",
            "offset", "inf", "nan"}
# Series that Prometheus makes itself, not the services.
PROMETHEUS_OWN = {"up"}


def metric_names(expr: str) -> set[str]:
    """Every metric name in ``expr``: identifiers that are not functions, keywords, label
    names (inside {} or after by/without/on/ignoring/group_*), or template variables."""
    s = re.sub(r'"(?:[^"\\]|\\.)*"', '""', expr)                  # strings
    s = re.sub(r"\{[^}]*\}", "", s)                                 # label matchers
    s = re.sub(r"\[[^\]]*\]", "", s)                                # range selectors
    s = re.sub(r"\$\{?\w+\}?", "", s)                               # Grafana variables
    s = re.sub(r"\b(by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)", " ", s)
    names = set()
    for m in re.finditer(r"[A-Za-z_:][A-Za-z0-9_:]*", s):
        name = m.group(0)
        rest = s[m.end():].lstrip()
        if rest.startswith("(") or name.lower() in KEYWORDS:
            continue
        if m.start() > 0 and (s[m.start() - 1].isdigit() or s[m.start() - 1] == "."):
            continue  # part of a number such as 1e9
        names.add(name)
    return names


def exported_names(text: str) -> set[str]:
    """Series names a Prometheus text page exposes, with the suffixes of histograms and summaries
    (from TYPE lines, so labelled metrics with no sample yet count too)."""
    names = set()
    for line in text.splitlines():
        if line.startswith("# TYPE "):
            _, _, name, kind = line.split(maxsplit=3)
            names.add(name)
            if kind == "counter":  # prometheus_client's family name; its samples end in _total
                names.add(f"{name}_total")
            elif kind == "histogram":
                names |= {f"{name}_bucket", f"{name}_sum", f"{name}_count"}
            elif kind == "summary":
                names |= {f"{name}_sum", f"{name}_count"}
        elif line and not line.startswith("#"):
            names.add(re.match(r"[^{\s]+", line).group(0))
    return names
