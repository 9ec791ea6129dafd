"""One self-contained HTML page of an audit review: each pool's reserved over time vs budget.

Charts are drawn with matplotlib (Agg, no display) as inline SVG: the page needs no network and
no script to show them. A few lines of inline script only mark the page once the browser has
laid the charts out (``data-charts-rendered``), which the tests read from a headless browser.
Floats appear here only, for drawing; every figure in the tables is the exact quantity.

Keys, pool names and messages come from what tenants wrote (budget keys, object names), so the
page treats every string as text: matplotlib's mathtext and TeX are off (a key ``$\\x$`` is drawn
as those four characters, never parsed), SVG text is escaped by matplotlib, HTML by
:func:`html.escape`, and long strings are cut. What one pool or event can add is bounded: a
pool's chart shows its :data:`CHART_KEYS` keys with the largest share of their budget, a cell
its :data:`CELL_KEYS` largest entries, a page its :data:`CHART_POOLS` pools with the largest
shares, and each says how many it left out and which.
"""

from __future__ import annotations

import html
import io
import json
from collections.abc import Mapping, Sequence
from datetime import datetime
from decimal import Decimal
from typing import Any, Final

from webhook.core.audit.events import parse_time
from webhook.core.base.errors import QuantityError
from webhook.core.base.quantities import parse_quantity

__all__ = ["CELL_KEYS", "CHART_KEYS", "CHART_POOLS", "render_page"]

CHART_POOLS: Final = 40  # pools charted per page
CHART_KEYS: Final = 6  # keys charted per pool (one row each)
CELL_KEYS: Final = 8  # entries shown of a mapping in one table cell
TEXT_CHARS: Final = 60  # longest key or name drawn or listed; longer ones are cut
LEFT_OUT_NAMED: Final = 10  # keys named in a "left out" note; the rest are counted

_GIB = 1024.0**3
_SCRIPT = """
window.addEventListener("load", function () {
  var charts = document.querySelectorAll("figure.pool svg");
  var drawn = 0;
  charts.forEach(function (svg) {
    var box = svg.getBoundingClientRect();
    if (box.width > 0 && box.height > 0 && svg.querySelector("path")) { drawn += 1; }
  });
  document.body.setAttribute("data-charts-rendered", drawn + "/" + charts.length);
});
"""
_STYLE = """
body { font-family: system-ui, sans-serif; margin: 2em; color: #222; }
table { border-collapse: collapse; margin: 1em 0; }
td, th { border: 1px solid #ccc; padding: 0.2em 0.6em; text-align: left; }
figure.pool { margin: 1.5em 0; } figure.pool svg { max-width: 100%; height: auto; }
"""


def render_page(title: str, result: Mapping[str, Any], chart: Mapping[str, Any]) -> str:
    """The page: charts per pool, then the tables of ``result``."""
    ranked = sorted(chart, key=lambda pool: (-_peak(chart[pool]), pool))
    figures = [_figure(pool, chart[pool]) for pool in ranked[:CHART_POOLS]]
    body = [f"<h1>{html.escape(title)}</h1>"]
    body += [f for f in figures if f] or ["<p>No pool had a budget in this log.</p>"]
    if len(ranked) > CHART_POOLS:
        note = _left_out(ranked[CHART_POOLS:], "not charted (smaller shares of budget)", "pool")
        body.append(f"<p>{html.escape(note)}</p>")
    body.append(_tables(result))
    data = html.escape(json.dumps(result, default=str))
    return (
        "<!DOCTYPE html>\n<html lang='en'><head><meta charset='utf-8'>"
        f"<title>{html.escape(title)}</title><style>{_STYLE}</style>"
        f"<script>{_SCRIPT}</script></head><body>\n"
        + "\n".join(body)
        + f"\n<script type='application/json' id='result'>{data}</script>\n</body></html>\n"
    )


def _figure(pool: str, series: Mapping[str, Any]) -> str:
    points: Sequence[Mapping[str, Any]] = series.get("points", [])
    denials: Sequence[Mapping[str, Any]] = series.get("denials", [])
    ranked = _ranked_keys(points)
    if not ranked:
        return ""
    keys, left_out = ranked[:CHART_KEYS], ranked[CHART_KEYS:]
    import matplotlib

    matplotlib.use("Agg")
    # Every string is text: no mathtext, no TeX; SVG keeps text as (escaped) text elements.
    with matplotlib.rc_context(
        {"text.parse_math": False, "text.usetex": False, "svg.fonttype": "none"}
    ):
        svg = _draw(pool, keys, points, denials)
    caption = f"{html.escape(_cut(pool))}: reserved over time against the budget; x marks a denial"
    if left_out:
        caption += "; " + html.escape(_left_out(left_out, "not charted (smaller shares of budget)"))
    dropped = series.get("keysLeftOut", 0)
    if isinstance(dropped, int) and dropped > 0:
        caption += (
            f"; up to {dropped} further keys of one event were not kept for the chart "
            "(smaller shares of budget)"
        )
    return (
        f"<figure class='pool' id='pool-{html.escape(_cut(pool))}'>{svg}"
        f"<figcaption>{caption}</figcaption></figure>"
    )


def _draw(
    pool: str,
    keys: Sequence[str],
    points: Sequence[Mapping[str, Any]],
    denials: Sequence[Mapping[str, Any]],
) -> str:
    from matplotlib import pyplot

    figure, axes = pyplot.subplots(
        len(keys), 1, figsize=(9, 2.4 * len(keys)), sharex=True, squeeze=False
    )
    times = [_time(p["time"]) for p in points]
    for row, key in enumerate(keys):
        ax = axes[row][0]
        scale, unit = _scale(key, points)
        reserved = [_number(p["reserved"].get(key)) / scale for p in points]
        budget = [_number(p["budget"].get(key)) / scale for p in points]
        ax.step(times, reserved, where="post", label="reserved", color="#1f77b4")
        ax.step(times, budget, where="post", label="budget", color="#d62728", linestyle="--")
        marked = [d for d in denials if key in d.get("reserved", {})]
        if marked:
            ax.scatter(
                [_time(d["time"]) for d in marked],
                [_number(d["reserved"][key]) / scale for d in marked],
                marker="x",
                color="#d62728",
                label="denied / would deny",
                zorder=3,
            )
        ax.set_ylabel(f"{_cut(key)}{unit}")
        ax.grid(alpha=0.3)
        if row == 0:
            ax.set_title(f"pool {_cut(pool)}")
            ax.legend(loc="upper left", fontsize="small")
    figure.autofmt_xdate()
    buffer = io.StringIO()
    figure.savefig(buffer, format="svg", bbox_inches="tight")
    pyplot.close(figure)
    svg = buffer.getvalue()
    return svg[svg.index("<svg") :]


def _peak(series: Mapping[str, Any]) -> float:
    """A pool's largest share of budget on any key at any time."""
    peaks = _peaks(series.get("points", []))
    return max(peaks.values(), default=0.0)


def _ranked_keys(points: Sequence[Mapping[str, Any]]) -> list[str]:
    """A pool's budget keys, largest peak share of budget first (then by name)."""
    peak = _peaks(points)
    return sorted(peak, key=lambda k: (-peak[k], k))


def _peaks(points: Sequence[Mapping[str, Any]]) -> dict[str, float]:
    peak: dict[str, float] = {}
    for point in points:
        budget = point.get("budget", {})
        reserved = point.get("reserved", {})
        for key, limit in budget.items():
            total = _number(limit)
            share = _number(reserved.get(key)) / total if total > 0 else 0.0
            peak[key] = max(peak.get(key, 0.0), share)
    return peak


def _left_out(names: Sequence[str], why: str, noun: str = "key") -> str:
    named = ", ".join(_cut(k) for k in names[:LEFT_OUT_NAMED])
    more = f" and {len(names) - LEFT_OUT_NAMED} more" if len(names) > LEFT_OUT_NAMED else ""
    return f"{len(names)} more {noun}{'s' * (len(names) != 1)} {why}: {named}{more}"


def _cut(text: object) -> str:
    value = str(text)
    return value if len(value) <= TEXT_CHARS else value[: TEXT_CHARS - 1] + "\u2026"


def _tables(result: Mapping[str, Any]) -> str:
    parts = []
    for name, title in (
        ("rows", "By namespace and kind"),
        ("pools", "By pool"),
        ("users", "By user"),
        ("denied", "Would be denied"),
        ("warned", "Would warn"),
        ("undecided", "Stored without a decision"),
        ("unreachable", "Webhook unreachable"),
    ):
        rows = result.get(name)
        if isinstance(rows, list) and rows:
            parts.append(f"<h2>{title}</h2>{_table(rows)}")
    return "\n".join(parts)


def _table(rows: Sequence[Mapping[str, Any]]) -> str:
    headers = list(rows[0])
    head = "".join(f"<th>{html.escape(h)}</th>" for h in headers)
    body = "".join(
        "<tr>" + "".join(f"<td>{html.escape(_text(r.get(h)))}</td>" for h in headers) + "</tr>"
        for r in rows
    )
    return f"<table><tr>{head}</tr>{body}</table>"


def _text(value: object) -> str:
    if isinstance(value, Mapping):
        ranked = sorted(value.items(), key=lambda item: (-_size(item[1]), str(item[0])))
        shown = ", ".join(f"{_cut(k)}={_cut(v)}" for k, v in ranked[:CELL_KEYS])
        if len(ranked) > CELL_KEYS:
            shown += f" (and {len(ranked) - CELL_KEYS} smaller, not shown)"
        return shown
    if value is None:
        return "-"
    text = str(value)
    return text if len(text) <= 4 * TEXT_CHARS else text[: 4 * TEXT_CHARS - 1] + "\u2026"


def _size(value: object) -> Decimal:
    try:
        return parse_quantity(value) if value is not None else Decimal(0)
    except QuantityError:
        return Decimal(0)


def _time(text: str) -> datetime:
    return parse_time(text)


def _number(text: object) -> float:
    try:
        return float(parse_quantity(text)) if text is not None else 0.0
    except QuantityError:
        return 0.0


def _scale(key: str, points: Sequence[Mapping[str, Any]]) -> tuple[float, str]:
    largest = max((_number(p["budget"].get(key)) for p in points), default=0.0)
    return (_GIB, " (GiB)") if largest >= _GIB else (1.0, "")
