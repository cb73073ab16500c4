"""The status page's chart: deliveries and failures per minute as inline SVG, drawn on
the server (no JavaScript, no chart library; the page's CSP allows no scripts).

One column per minute: delivered (green) from the baseline, failed (red) stacked on
top; quiet minutes draw nothing. Every bar carries its minute and count as data
attributes and a ``<title>`` a browser shows on hover.
"""

from __future__ import annotations

import datetime as dt

from markupsafe import Markup, escape

from spark_outbox.console.health import Activity

WIDTH, HEIGHT = 720.0, 160.0
LEFT, BOTTOM, TOP = 40.0, 18.0, 8.0
COLOURS = {"delivered": "#1b7f3b", "failed": "#b00020"}


def _bar(kind: str, minute: dt.datetime, count: int, x: float, y: float, h: float, w: float) -> str:
    label = f"{minute:%H:%M} {kind} {count}"
    return (
        f'<rect class="{kind}" data-minute="{minute:%Y-%m-%dT%H:%MZ}" data-count="{count}" '
        f'x="{x:.2f}" y="{y:.2f}" width="{w:.2f}" height="{h:.2f}" fill="{COLOURS[kind]}">'
        f"<title>{escape(label)}</title></rect>"
    )


def svg(activity: Activity, element_id: str = "deliveries-chart") -> Markup:
    plot_w, plot_h = WIDTH - LEFT, HEIGHT - BOTTOM - TOP
    peak = max((p.delivered + p.failed for p in activity.points), default=0)
    step = plot_w / activity.minutes
    scale = plot_h / peak if peak else 0.0
    base = HEIGHT - BOTTOM
    parts = [
        f'<svg xmlns="http://www.w3.org/2000/svg" id="{element_id}" role="img" '
        f'viewBox="0 0 {WIDTH:.0f} {HEIGHT:.0f}" width="{WIDTH:.0f}" height="{HEIGHT:.0f}" '
        f'data-peak="{peak}">',
        "<title>Deliveries (green) and failures (red) per minute</title>",
        f'<line x1="{LEFT}" y1="{base}" x2="{WIDTH}" y2="{base}" stroke="#5b6570"/>',
        f'<text x="{LEFT - 4}" y="{TOP + 10}" text-anchor="end" font-size="10">{peak}</text>',
        f'<text x="{LEFT - 4}" y="{base}" text-anchor="end" font-size="10">0</text>',
        f'<text x="{LEFT}" y="{HEIGHT - 4}" font-size="10">{activity.start:%H:%M}</text>',
        f'<text x="{WIDTH}" y="{HEIGHT - 4}" text-anchor="end" font-size="10">now</text>',
    ]
    for p in activity.points:
        index = (p.minute - activity.start) // dt.timedelta(minutes=1)
        x = LEFT + index * step
        delivered_h, failed_h = p.delivered * scale, p.failed * scale
        if p.delivered:
            parts.append(
                _bar("delivered", p.minute, p.delivered, x, base - delivered_h, delivered_h, step)
            )
        if p.failed:
            top = base - delivered_h - failed_h
            parts.append(_bar("failed", p.minute, p.failed, x, top, failed_h, step))
    parts.append("</svg>")
    return Markup("".join(parts))  # noqa: S704  (built from numbers and escaped text only)
