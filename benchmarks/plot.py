"""A dependency-free SVG bar chart of a comparison run (tokens/s per configuration).

Owns ``bar_chart_svg``: one bar per (configuration, concurrency) row, grouped by configuration,
value printed on each bar. Plain SVG so the docs show it without matplotlib.
"""

from __future__ import annotations

from html import escape
from typing import Any

_COLOURS = {"hf-generate": "#9e9e9e", "engine": "#64b5f6", "triton-chat": "#1565c0", "vllm-cpu": "#ef6c00"}


def bar_chart_svg(title: str, rows: list[dict[str, Any]]) -> str:
    width, height, left, bottom, top = 760, 360, 60, 60, 40
    bar, gap = 34, 6
    top_value = max((float(r["tokens_per_s"]) for r in rows), default=1.0) or 1.0
    scale = (height - top - bottom) / top_value
    parts = [
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" font-family="sans-serif" font-size="11">',
        f'<text x="{width / 2}" y="20" text-anchor="middle" font-size="14">{escape(title)}</text>',
        f'<line x1="{left}" y1="{height - bottom}" x2="{width - 10}" y2="{height - bottom}" stroke="#333"/>',
    ]
    x = left + 10
    previous = None
    for row in rows:
        label = str(row["label"])
        if previous is not None and label != previous:
            x += 18  # space between configurations
        previous = label
        value = float(row["tokens_per_s"])
        h = value * scale
        y = height - bottom - h
        colour = _COLOURS.get(label, "#607d8b")
        parts.append(f'<rect x="{x}" y="{y:.1f}" width="{bar}" height="{h:.1f}" fill="{colour}"/>')
        parts.append(f'<text x="{x + bar / 2}" y="{y - 4:.1f}" text-anchor="middle">{value:.0f}</text>')
        kind = "bs" if label == "hf-generate" else "C="
        parts.append(
            f'<text x="{x + bar / 2}" y="{height - bottom + 14}" text-anchor="middle">{kind}{row["concurrency"]}</text>'
        )
        x += bar + gap
    legend_x = left + 10
    for label, colour in _COLOURS.items():
        if any(r["label"] == label for r in rows):
            parts.append(f'<rect x="{legend_x}" y="{height - 24}" width="12" height="12" fill="{colour}"/>')
            parts.append(f'<text x="{legend_x + 16}" y="{height - 14}">{escape(label)}</text>')
            legend_x += 130
    parts.append(f'<text x="14" y="{height / 2}" transform="rotate(-90 14 {height / 2})">tokens/s</text>')
    parts.append("</svg>")
    return "\n".join(parts) + "\n"
