"""The human report of ``analyze``: Markdown with PNG charts (matplotlib, headless)."""

from __future__ import annotations

import os
from typing import Any

__all__ = ["write_report"]


def _bar(path: str, title: str, labels: list[str], values: list[float], xlabel: str = "") -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 3.2))
    ax.bar(range(len(values)), values, color="#3b6ea8")
    ax.set_xticks(range(len(labels)), labels, rotation=30, ha="right", fontsize=8)
    ax.set_title(title)
    ax.set_xlabel(xlabel)
    ax.set_ylabel("messages")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def write_report(out: str, summary: dict[str, Any], tables: dict[str, list[dict[str, Any]]]) -> str:
    """Write ``report.md``, ``charts/*.png`` and nothing else; returns the report's path."""
    charts = os.path.join(out, "charts")
    os.makedirs(charts, exist_ok=True)
    hours: dict[str, int] = {}
    for r in tables["per_hour"]:
        key = r["hour"].strftime("%Y-%m-%d %H:00")
        hours[key] = hours.get(key, 0) + r["messages"]
    hour_keys = sorted(hours)
    _bar(os.path.join(charts, "messages_per_hour.png"), "Messages per hour (UTC)", hour_keys, [hours[k] for k in hour_keys])
    ttl = summary["ttl_distribution"]
    _bar(os.path.join(charts, "ttl_distribution.png"), "Per-message TTL", list(ttl), list(ttl.values()))
    removals = summary["removals"] or {"(none)": 0}
    _bar(os.path.join(charts, "removals.png"), "Removed messages by reason", list(removals), list(removals.values()))

    lines = [
        "# ttlbroker export: analysis",
        "",
        f"Input: `{summary['input']}`. From {summary['first']} to {summary['last']} (UTC).",
        "",
        "| messages | live | payload bytes | subjects |",
        "| ---: | ---: | ---: | ---: |",
        f"| {summary['messages']:,} | {summary['live']:,} | {summary['bytes']:,} | {summary['subjects']:,} |",
        "",
        "## Per topic",
        "",
        "| stream | topic | messages | live | bytes |",
        "| --- | --- | ---: | ---: | ---: |",
        *(f"| {r['stream']} | {r['topic']} | {r['messages']:,} | {r['live']:,} | {r['bytes']:,} |"
          for r in sorted(tables["per_topic"], key=lambda r: (r["stream"], r["topic"]))),
        "",
        "## Messages per hour",
        "",
        "![messages per hour](charts/messages_per_hour.png)",
        "",
        "## TTL distribution",
        "",
        "![TTL distribution](charts/ttl_distribution.png)",
        "",
        "| bucket | messages |",
        "| --- | ---: |",
        *(f"| {k} | {v:,} |" for k, v in ttl.items()),
        "",
        "## Removals and markers",
        "",
        "![removals](charts/removals.png)",
        "",
        "| removed because | messages |",
        "| --- | ---: |",
        *(f"| {k} | {v:,} |" for k, v in sorted(summary["removals"].items())),
        "",
        "| marker reason | markers |",
        "| --- | ---: |",
        *(f"| {k} | {v:,} |" for k, v in sorted(summary["markers"].items())),
        "",
        "## Largest subjects",
        "",
        "| stream | topic | subject | messages | bytes |",
        "| --- | --- | --- | ---: | ---: |",
        *(f"| {r['stream']} | {r['topic']} | `{r['subject']}` | {r['messages']:,} | {r['bytes']:,} |"
          for r in tables["largest_subjects"]),
        "",
        "Tables: Parquet folders beside this file (`per_topic`, `per_subject`, `per_hour`, "
        "`ttl_distribution`, `removals`, `markers`, `largest_subjects`).",
        "",
    ]
    path = os.path.join(out, "report.md")
    with open(path, "w", encoding="utf-8") as f:
        f.write("\n".join(lines))
    return path
