"""Showing a run: the rich table, docs/benchmarks.md and its chart."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

from bench.results import Results, Series, Target, check_targets

SECTION_TITLES = {
    "outofbox": "Out of the box: `nsqworker run`, default settings, vs pynsq's Reader",
    "consume": "Consume (in process; the tables from here on)",
    "publish": "Publish",
    "latency": "Latency",
    "memory": "Memory",
    "scale": "Scale",
    "cpu": "Hot-path CPU, offline feed",
    "telemetry": "Telemetry cost (bench/bench_telemetry.py)",
    "handlers": "Handler features: typed bodies, hooks, time limits (bench/bench_handlers.py)",
    "seam": "The transport seam: before and after, one run (bench/seam.py)",
    "nats": "NATS JetStream: `nsqworker run --transport nats` vs natscli (the limit), FastStream and nats-py (bench/nats.py)",
    "streams": "RabbitMQ Streams: `nsqworker run --transport rabbitmq-stream` and StreamProducer vs the Java stream-client (bench/streams.py)",
}
CPU_SECTIONS = ("consume", "publish")
COLUMNS = ("case", "unit", "median", "min-max", "runs", "CPU", "vs pynsq", "vs limit", "target")


# --- formatting -----------------------------------------------------------------------


def number(value: float, unit: str) -> str:
    """A value in its unit, rounded for reading."""
    if unit == "msgs/s":
        return f"{value:,.0f}"
    if unit == "%":
        return f"{value:.1f}%"
    if value >= 100:
        return f"{value:,.0f}"
    if value >= 10:
        return f"{value:.1f}"
    return f"{value:.2f}"


def ratio_text(ratio: float | None, spread: tuple[float, float] | None = None) -> str:
    """``28.1x`` for ratios of 1 and more, ``55%`` below; with the run-by-run range."""
    if ratio is None:
        return ""

    def one(r: float) -> str:
        return f"{r:.1f}x" if r >= 1 else f"{r:.0%}"

    if spread is None or spread[0] == spread[1]:
        return one(ratio)
    return f"{one(ratio)} ({one(spread[0])}-{one(spread[1])})"


def verdict(target: Target) -> str:
    return {True: "PASS", False: "MISS", None: "n/a"}[target.passed]


def cells(results: Results, series: Series, targets: list[Target]) -> list[str]:
    """The columns of one row."""
    target = "; ".join(f"{t.short}: {verdict(t)}" for t in targets if t.row == series.key)
    runs = f"{len(series.values)}" + (f" ({len(series.errors)} failed)" if series.errors else "")
    cpu = [raw["cpu"] for raw in series.raw if "cpu" in raw and series.section in CPU_SECTIONS]
    load = f"{sum(cpu) / len(cpu):.0%}" if cpu else ""
    if not series.ok:
        return [series.label, series.unit, "failed", "", runs, "", "", "", target]
    pynsq, limit = results.references.get(series.key, ("", ""))
    return [
        series.label,
        series.unit,
        number(series.median, series.unit),
        f"{number(series.low, series.unit)}-{number(series.high, series.unit)}",
        runs,
        load,
        _versus(results, series.key, pynsq),
        _versus(results, series.key, limit),
        target,
    ]


def _versus(results: Results, key: str, reference: str) -> str:
    if not reference or reference == key:
        return ""
    return ratio_text(results.ratio(key, reference), results.ratio_range(key, reference))


def sections(results: Results) -> Iterator[tuple[str, list[Series]]]:
    """Rows grouped by section, in measuring order."""
    order: dict[str, list[Series]] = {}
    for series in results.series.values():
        order.setdefault(series.section, []).append(series)
    yield from order.items()


# --- the terminal -----------------------------------------------------------------------


def print_table(results: Results, console: Console) -> None:
    """One table of every row, sections apart, targets marked where they apply."""
    targets = check_targets(results)
    table = Table(title="nsqworker benchmarks", show_lines=False)
    for column in COLUMNS:
        left = column in ("case", "unit", "target")
        table.add_column(column, justify="left" if left else "right", no_wrap=column != "case")
    for section, rows in sections(results):
        table.add_row(f"[bold]{SECTION_TITLES.get(section, section)}[/bold]")
        for series in rows:
            row = cells(results, series, targets)
            row[-1] = (
                row[-1].replace("PASS", "[green]PASS[/green]").replace("MISS", "[red]MISS[/red]")
            )
            table.add_row(*row)
        table.add_section()
    console.print(table)
    for series in results.series.values():
        for error in series.errors[:1]:
            console.print(f"[red]{series.label}: {error.splitlines()[0]}[/red]")


# --- docs/benchmarks.md -----------------------------------------------------------------


def markdown(results: Results, chart: str | None, method: str) -> str:
    """The whole of docs/benchmarks.md."""
    meta = results.meta
    targets = check_targets(results)
    out = [
        "# Benchmarks",
        "",
        f"Generated by `{meta.get('command', 'make bench')}` on {meta.get('date', '?')} "
        f"at commit `{meta.get('commit', '?')}`. Do not edit by hand: run `make bench`.",
        "",
        _environment(meta),
        "",
        "The machine is shared (other jobs ran during the run) and nsqd runs on the same",
        "two cores as the client it serves, so absolute numbers are noisy. Every client",
        "ran side by side in the same run, each in its own process, "
        f"{_runs(meta.get('runs', 3))} interleaved;",
        "tables give the median, the lowest and highest run, and ratios of medians with",
        "the run-by-run range in brackets (1 run: no range).",
        "",
        "## Targets",
        "",
        "| target | measured | result |",
        "|---|---|---|",
        *[f"| {t.text} | {t.measured} | **{verdict(t)}** |" for t in targets],
        "",
        "## Results",
        "",
    ]
    if chart:
        out += [f"![benchmark chart]({chart})", ""]
    for section, rows in sections(results):
        out += [f"### {SECTION_TITLES.get(section, section)}", ""]
        out += ["| " + " | ".join(COLUMNS) + " |", "|" + "---|" * len(COLUMNS)]
        for series in rows:
            row = [c.replace("|", "\\|") for c in cells(results, series, targets)]
            out.append("| " + " | ".join(row) + " |")
        out += [*_section_notes(results, section), ""]
    out += [method.strip(), ""]
    return "\n".join(out)


def _runs(n: int) -> str:
    return "once" if n == 1 else f"{n} times"


def _environment(meta: dict[str, Any]) -> str:
    parts = [
        f"Machine: {meta.get('cpu', '?')}, {meta.get('cores', '?')} cores "
        f"(load average {meta.get('load_before', '?')} before, "
        f"{meta.get('load_after', '?')} after), Linux {meta.get('kernel', '?')}.",
        f"Python {meta.get('python', '?')}; our clients on {meta.get('loop', '?')}; "
        f"pynsq on {meta.get('pynsq', '?')}; {meta.get('nsqd', 'nsqd')}; "
        f"bench_reader/bench_writer from the same NSQ release.",
    ]
    return "\n".join(parts)


def _section_notes(results: Results, section: str) -> list[str]:
    notes = []
    for series in results.series.values():
        if series.section != section:
            continue
        if series.note:
            notes.append(f"- {series.label}: {series.note}")
        if series.errors:
            first = series.errors[0].splitlines()[0]
            notes.append(f"- {series.label}: {len(series.errors)} run(s) failed: `{first}`")
    return ["", *notes] if notes else []


# --- the chart ----------------------------------------------------------------------------

PANELS = (
    ("consume", "Consume, msgs/s (higher is better)", True),
    ("publish", "Publish, msgs/s (log scale)", True),
    ("latency", "Latency, ms (log scale, lower is better)", False),
    ("memory", "Memory, MB (lower is better)", False),
)


def chart(results: Results, path: Path) -> bool:
    """Horizontal bars (median, whiskers from lowest to highest run), one panel per
    section measured; False when nothing was measured to draw."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    panels = [
        (title, [s for s in results.series.values() if s.section == section and s.ok], log)
        for section, title, log in PANELS
    ]
    panels = [p for p in panels if p[1]]
    if not panels:
        return False
    heights = [max(1.2, 0.32 * len(rows) + 0.8) for _, rows, _ in panels]
    fig, axes = plt.subplots(len(panels), 1, figsize=(10, sum(heights)), squeeze=False)
    fig.subplots_adjust(left=0.42)
    for ax, (title, rows, _) in zip(axes[:, 0], panels, strict=True):
        _panel(ax, title, rows)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return True


def _panel(ax: Any, title: str, rows: list[Series]) -> None:
    from matplotlib.ticker import FuncFormatter

    labels = [s.label for s in rows]
    medians = [s.median for s in rows]
    low = [s.median - s.low for s in rows]
    high = [s.high - s.median for s in rows]
    colors = [_color(s.key) for s in rows]
    y = list(range(len(rows)))
    ax.barh(y, medians, xerr=[low, high], color=colors, capsize=3)
    ax.set_yticks(y, labels, fontsize=8)
    ax.invert_yaxis()
    ax.set_title(title, fontsize=10, loc="left")
    if "log" in title:
        ax.set_xscale("log")
    else:
        ax.xaxis.set_major_formatter(FuncFormatter(lambda x, _: f"{x:,.0f}"))
    for i, series in enumerate(rows):
        ax.annotate(number(series.median, series.unit), (series.high, i), xytext=(5, 0),
                    textcoords="offset points", va="center", fontsize=7)  # fmt: skip
    ax.margins(x=0.12)


def _color(key: str) -> str:
    if "pynsq" in key:
        return "#c44e52"
    if key.endswith(("-go", "bench_reader")):
        return "#8c8c8c"
    return "#4c72b0"
