"""Figures of an evaluation report (PNG): accepted lengths, per-position acceptance, categories.

Accepted lengths and draft positions are whole numbers, so their axes carry integer ticks only.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any


def write_plots(report: dict[str, Any], out: Path) -> list[Path]:
    """Accepted-length histogram, per-position acceptance, and τ/speedup per category (PNG)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import MaxNLocator

    paths = []
    hist = report["accepted_length_histogram"]
    fig, ax = plt.subplots(figsize=(5, 3.2))
    ax.bar([int(k) for k in hist], list(hist.values()), color="#4472c4")
    ax.set(
        xlabel="tokens accepted per target forward",
        ylabel="steps",
        title=f"accepted length (τ = {report['tau']:.2f})",
    )
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax.yaxis.set_major_locator(MaxNLocator(integer=True))
    fig.tight_layout()
    paths.append(out / "accepted_length_hist.png")
    fig.savefig(paths[-1], dpi=110)
    plt.close(fig)

    ppa = report["per_position_acceptance"]
    fig, ax = plt.subplots(figsize=(5, 3.2))
    ax.plot(range(1, len(ppa) + 1), ppa, marker="o")
    ax.set(xlabel="draft position", ylabel="acceptance rate", ylim=(0, 1), title="per-position acceptance")
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    fig.tight_layout()
    paths.append(out / "per_position_acceptance.png")
    fig.savefig(paths[-1], dpi=110)
    plt.close(fig)

    cats = report.get("per_category") or {"all": report}
    fig, ax = plt.subplots(figsize=(max(5, 0.7 * len(cats) + 2), 3.4))
    x = range(len(cats))
    ax.bar([i - 0.2 for i in x], [c["tau"] for c in cats.values()], width=0.4, label="τ")
    ax.bar([i + 0.2 for i in x], [c["speedup"] for c in cats.values()], width=0.4, label="speedup")
    ax.axhline(1.0, color="grey", lw=0.8)
    ax.set_xticks(list(x), list(cats), rotation=45, ha="right")
    ax.legend()
    ax.set_title("τ and speedup per category")
    fig.tight_layout()
    paths.append(out / "per_category.png")
    fig.savefig(paths[-1], dpi=110)
    plt.close(fig)
    return paths
