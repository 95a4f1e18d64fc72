"""The translation report's figures: training curves, model selection, inference time, sparsity, self-normalization."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from .._common import pyplot, save_figure
from .names import display_name

#: relative run-to-run variation of timings on a shared machine: differences below it are noise
NOISE = 0.10


def write_figures(results: dict, stats: dict, out_dir: Path) -> list:
    """PNG figures: training curves (steps, time), inference vs beam, zeros per step, Σ α-ReLU per step."""
    plt = pyplot()
    if plt is None:
        return []
    systems = results["systems"]
    files = []

    # BLEU is one scale for every system: one axis against steps, one against time
    fig, axes = plt.subplots(1, 2, figsize=(10, 3.6))
    # the time axis: steps × the interleaved time per step where the systems were timed interleaved (a busy
    # machine's wall clock during one run's training would shift that run's curve), else each run's own clock
    interleaved = all("interleaved_seconds_per_step" in rec for rec in systems.values())
    for s, rec in systems.items():
        h = rec["history"]
        axes[0].plot([e["step"] for e in h], [e["val_bleu"] for e in h], marker="o", label=display_name(s))
        minutes = ([e["step"] * rec["interleaved_seconds_per_step"] / 60 for e in h] if interleaved else
                   [e["train_seconds"] / 60 for e in h])
        axes[1].plot(minutes, [e["val_bleu"] for e in h], marker="o", label=display_name(s))
    axes[0].set_xlabel("training step")
    axes[1].set_xlabel("steps × interleaved time per step (min)" if interleaved else "training time (min)")
    for a in axes:
        a.set_ylabel("val BLEU (greedy)")
        a.grid(alpha=0.3)
        a.legend()
    fig.suptitle("Validation BLEU during training (cf. the paper, Figs. 2-3)")
    fig.tight_layout()
    save_figure(fig, out_dir / "curves_bleu.png", dpi=120)
    plt.close(fig)
    files.append("curves_bleu.png")

    # each system's validation loss is its own loss (cross-entropy, sparsemax, entmax, α-ReLU
    # losses): the values are not comparable across systems, so one panel and one scale each
    fig, axes = plt.subplots(1, len(systems), figsize=(3.0 * len(systems), 3.2), squeeze=False)
    for ax, (s, rec) in zip(axes[0], systems.items()):
        h = rec["history"]
        ax.plot([e["step"] for e in h], [e["val_loss"] for e in h], marker="o")
        ax.set_title(display_name(s), fontsize=10)
        ax.set_xlabel("training step")
        ax.grid(alpha=0.3)
    axes[0][0].set_ylabel("val loss per token (own loss)")
    fig.suptitle("Validation loss of each system's own training loss (scales differ: compare shapes, not values)",
                 fontsize=10)
    fig.tight_layout()
    save_figure(fig, out_dir / "curves_loss.png", dpi=120)
    plt.close(fig)
    files.append("curves_loss.png")

    if results["settings"]["training"].get("select", "last") != "last" or len(results["settings"].get("seeds", [])) > 1:
        files.append(_selection_figure(plt, results, out_dir))

    # the paper's Fig. 4 compares the systems at each beam size: time relative to softmax (as in the tables);
    # with interleaved timings, bars give the 95% bootstrap intervals, else a band of assumed run-to-run noise
    if "inference_seconds" in systems.get("softmax", {}):  # (absent when softmax has no run on the timing device)
        base = systems["softmax"]["inference_seconds"]
        speed = results.get("speed")
        fig, ax = plt.subplots(figsize=(5.5, 3.6))
        bs = sorted(base, key=int)
        if speed is None:
            ax.axhspan(1 - NOISE, 1 + NOISE, color="0.85", label=f"±{NOISE:.0%}: timing noise")
        for s, rec in systems.items():
            if "inference_seconds" not in rec:
                continue
            ys = [rec["inference_seconds"][b] / base[b] for b in bs]
            if speed is not None and s in speed["inference"]:
                ci = [speed["inference"][s][b]["ci"] for b in bs]
                ax.errorbar([int(b) for b in bs], ys, yerr=[[max(0.0, y - c[0]) for y, c in zip(ys, ci)],
                                                            [max(0.0, c[1] - y) for y, c in zip(ys, ci)]],
                            marker="o", capsize=3, label=display_name(s))
            else:
                ax.plot([int(b) for b in bs], ys, marker="o", label=display_name(s))
        ax.set_xscale("log", base=2); ax.set_xticks([int(b) for b in bs], bs); ax.minorticks_off()
        ax.set_xlabel("beam size"); ax.set_ylabel("inference time / softmax's")
        ax.set_title("Inference time vs beam size (cf. the paper, Fig. 4)", fontsize=10); ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
        fig.tight_layout(); save_figure(fig, out_dir / "inference_beam.png", dpi=120); plt.close(fig)
        files.append("inference_beam.png")

    sparse = [s for s in systems if s != "softmax"]
    if sparse:
        fig, ax = plt.subplots(figsize=(5.5, 3.6))
        shares = {s: [z / stats[s].vocab for z in stats[s].zeros] for s in sparse}
        lo = max(0.0, min(min(v) for v in shares.values() if v) - 0.01) if any(shares.values()) else 0.0
        bins = [lo + (1 - lo) * i / 40 for i in range(41)]  # the range the data cover
        for s, style in zip(sparse, ("-", "--", ":", "-.")):
            # outlines with the same bins, so that no system's histogram hides another's
            ax.hist(shares[s], bins=bins, histtype="step", linewidth=1.8, linestyle=style, label=display_name(s))
        ax.set_xlim(lo, 1.0)
        ax.set_xlabel("share of exact zeros in the next-token distribution"); ax.set_ylabel("decoding steps")
        ax.set_title("Sparsity per decoding step (cf. the paper, Figs. 5-6)"); ax.legend()
        fig.tight_layout(); save_figure(fig, out_dir / "zeros_per_step.png", dpi=120); plt.close(fig)
        files.append("zeros_per_step.png")
    if "alpha_relu" in systems:
        fig, ax = plt.subplots(figsize=(5.5, 3.6))
        ax.hist(stats["alpha_relu"].sums, bins=50)
        ax.set_xlabel("Σ 1.5-ReLU(z) at a decoding step"); ax.set_ylabel("decoding steps")
        ax.set_title("Self-normalization (cf. the paper, Fig. 9)")
        fig.tight_layout(); save_figure(fig, out_dir / "alpha_relu_sums.png", dpi=120); plt.close(fig)
        files.append("alpha_relu_sums.png")
    return files


def _selection_figure(plt: Any, results: dict, out_dir: Path) -> str:
    """Validation BLEU and loss of every run against steps; ★ the kept model, × the last evaluation."""
    systems = results["systems"]
    fig, axes = plt.subplots(2, len(systems), figsize=(3.4 * len(systems), 5.6), squeeze=False)
    for col, (system, rec) in enumerate(systems.items()):
        for seed, r in rec["seeds"].items():
            h = r["history"]
            steps = [e["step"] for e in h]
            for row, key in enumerate(("val_bleu", "val_loss")):
                ax = axes[row][col]
                line, = ax.plot(steps, [e[key] for e in h], marker=".", label=f"seed {seed}")
                kept = [e for e in h if e["step"] == r.get("kept_step")]
                if kept:
                    ax.plot([kept[0]["step"]], [kept[0][key]], marker="*", markersize=13, color=line.get_color(),
                            markeredgecolor="black", linestyle="none")
                ax.plot([steps[-1]], [h[-1][key]], marker="x", markersize=8, color=line.get_color(), linestyle="none")
        axes[0][col].set_title(display_name(system))
        axes[1][col].set_xlabel("training step")
        for row in range(2):
            axes[row][col].grid(alpha=0.3)
        axes[0][col].legend(fontsize=7)
    axes[0][0].set_ylabel("val BLEU (greedy)")
    axes[1][0].set_ylabel("val loss per token (own loss)")
    fig.suptitle("Validation curves per seed: ★ kept model, × training stopped")
    fig.tight_layout()
    save_figure(fig, out_dir / "curves_selection.png", dpi=120)
    plt.close(fig)
    return "curves_selection.png"
