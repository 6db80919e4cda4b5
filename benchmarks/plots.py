"""PNG plots of benchmark results (matplotlib, Agg backend: no display needed).

- engine: grouped bars of new tokens/s per engine and batch size (log scale), one PNG;
- serve: throughput vs concurrency (closed loop), latency percentiles vs concurrency and vs
  offered load (open loop), one PNG each.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

ENGINE_COLOURS = {
    "attnserve": "#1f77b4",
    "ctranslate2": "#ff7f0e",
    "hf": "#2ca02c",
}


def _pyplot() -> Any:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _name(result: dict[str, Any], kind: str, what: str, out_dir: Path) -> Path:
    suffix = "-tiny" if result["settings"].get("tiny") else ""
    out_dir.mkdir(parents=True, exist_ok=True)
    return out_dir / f"{kind}-{result['run_id']}{suffix}-{what}.png"


def _title(result: dict[str, Any]) -> str:
    machine = result["machine"]
    return (
        f"{machine['cpu_model']}, {machine['logical_cpus']} CPUs, {machine['device']}, "
        f"{machine['date'][:10]}"
    )


def engine_plots(result: dict[str, Any], out_dir: Path) -> list[Path]:
    """Engine comparison bars: new tokens/s per engine, grouped by batch size."""
    plt = _pyplot()
    rows = [r for r in result["results"] if r.get("tokens_per_s")]
    batches = sorted({r["batch"] for r in rows}) or result["settings"]["batches"]
    engines = [e["name"] for e in result["engines"]]
    family = {e["name"]: e["family"] for e in result["engines"]}
    fig, ax = plt.subplots(figsize=(min(14, max(8, 0.35 * len(batches) * len(engines))), 5.5))
    width = 0.8 / max(1, len(engines))
    hatches = {"fp32": "", "int8": "//"}
    for i, engine in enumerate(engines):
        values = []
        for batch in batches:
            row = next((r for r in rows if r["engine"] == engine and r["batch"] == batch), None)
            values.append(row["tokens_per_s"] if row else 0.0)
        positions = [b + (i - (len(engines) - 1) / 2) * width for b in range(len(batches))]
        precision = next((e["precision"] for e in result["engines"] if e["name"] == engine), "")
        bars = ax.bar(
            positions,
            values,
            width,
            label=engine,
            color=ENGINE_COLOURS.get(family.get(engine, ""), "grey"),
            hatch=hatches.get(precision, ""),
            edgecolor="black",
            linewidth=0.4,
            alpha=0.55 + 0.45 * (i % 2),
        )
        for bar, value in zip(bars, values, strict=True):
            if value:
                ax.annotate(
                    f"{value:.0f}",
                    (bar.get_x() + bar.get_width() / 2, value),
                    ha="center",
                    va="bottom",
                    fontsize=6,
                    rotation=90,
                )
    settings = result["settings"]
    ax.set_xticks(range(len(batches)), [f"batch {b}" for b in batches])
    ax.set_yscale("log")
    ax.set_ylabel("new tokens / s (log)")
    ax.set_title(
        f"Greedy decoding, source {settings['source_length']}, {settings['new_tokens']} new "
        f"tokens, {settings['threads']} threads\n{_title(result)}",
        fontsize=9,
    )
    ax.legend(fontsize=7, ncol=2)
    ax.grid(axis="y", which="both", alpha=0.3)
    fig.tight_layout()
    path = _name(result, "engine", "engines", out_dir)
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return [path]


def _series_label(point: dict[str, Any]) -> str:
    return f"{point['model']} {point['method']} [{point['variant']}]"


def _latency_plot(
    result: dict[str, Any],
    points: list[dict[str, Any]],
    x_key: str,
    xlabel: str,
    what: str,
    suffix: str,
    out_dir: Path,
) -> Path | None:
    """p50 / p90 / p99 latency against ``x_key``, one panel per model / method (None: no points)."""
    plt = _pyplot()
    panels = sorted({(p["model"], p["method"]) for p in points})
    if not panels:
        return None
    fig, axes = plt.subplots(1, len(panels), figsize=(5 * len(panels), 4.5), squeeze=False)
    for ax, panel in zip(axes[0], panels, strict=True):
        mine = [p for p in points if (p["model"], p["method"]) == panel]
        for variant in sorted({p["variant"] for p in mine}):
            line = sorted((p for p in mine if p["variant"] == variant), key=lambda p: p[x_key])
            x = [p[x_key] for p in line]
            for q, style in (("p50", "-"), ("p90", "--"), ("p99", ":")):
                y = [p["latency_ms"][q] or float("nan") for p in line]
                ax.plot(x, y, style, marker=".", label=f"{variant} {q}")
        if x_key == "concurrency":
            ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_xlabel(xlabel)
        ax.set_ylabel("latency ms (log)")
        ax.set_title(" ".join(panel), fontsize=9)
        ax.grid(alpha=0.3, which="both")
        ax.legend(fontsize=6)
    fig.suptitle(f"Latency percentiles vs {what} — {_title(result)}", fontsize=9)
    fig.tight_layout()
    path = _name(result, "serve", suffix, out_dir)
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


def serve_plots(result: dict[str, Any], out_dir: Path) -> list[Path]:
    """Throughput vs concurrency, latency percentiles vs concurrency and vs offered load."""
    plt = _pyplot()
    paths = []
    fixed = [p for p in result["points"] if p.get("workload", "fixed") == "fixed"]
    closed = [p for p in fixed if p["loop"] == "closed"]
    open_ = [p for p in fixed if p["loop"] == "open"]
    series: dict[str, list[dict[str, Any]]] = {}
    for point in closed:
        series.setdefault(_series_label(point), []).append(point)

    # 1. throughput vs concurrency: requests/s (images or sequences) and tokens/s panels.
    fig, axes = plt.subplots(1, 2, figsize=(13, 5))
    for label, points in sorted(series.items()):
        points = sorted(points, key=lambda p: p["concurrency"])
        x = [p["concurrency"] for p in points]
        if points[0]["method"] in ("classify", "kserve_infer"):
            axes[0].plot(x, [p["throughput_rps"] for p in points], marker="o", label=label)
        else:
            axes[1].plot(x, [p.get("tokens_per_s") or 0 for p in points], marker="o", label=label)
    axes[0].set_title("classification: images / s")
    axes[1].set_title("translation: new tokens / s")
    for ax in axes:
        ax.set_xscale("log", base=2)
        ax.set_xlabel("concurrent clients (closed loop)")
        ax.grid(alpha=0.3)
        if ax.get_legend_handles_labels()[0]:
            ax.legend(fontsize=7)
    fig.suptitle(f"Served throughput vs concurrency — {_title(result)}", fontsize=9)
    fig.tight_layout()
    path = _name(result, "serve", "throughput", out_dir)
    fig.savefig(path, dpi=120)
    plt.close(fig)
    paths.append(path)

    # 2. latency percentiles vs concurrency (closed loop); 3. vs offered load (open loop).
    for loop_points, x_key, xlabel, what, suffix in (
        (closed, "concurrency", "concurrent clients", "load (closed loop)", "latency-closed"),
        (
            open_,
            "rate",
            "offered load (requests / s, Poisson)",
            "offered load (open loop)",
            "latency-open",
        ),
    ):
        plotted = _latency_plot(result, loop_points, x_key, xlabel, what, suffix, out_dir)
        if plotted is not None:
            paths.append(plotted)
    return paths
