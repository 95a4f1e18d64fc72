"""The figures of ``softargmax reproduce lm``: accuracy (Table 3), learning curves with the plateau window,
decoding (Fig. 4) and cost (Fig. 7).
"""

from __future__ import annotations

import statistics
from pathlib import Path
from typing import Any, Optional

import numpy as np

from .._common import pyplot, save_figure
from .convergence import PLATEAU_POINTS, PLATEAU_SHARE, plateau
from .plan import SHORT, TABLE3, loss_label


def _colors() -> dict[str, str]:
    return {"kl": "#4c72b0", "chi_square": "#dd8452", "alpha1.5": "#55a868", "jensen_shannon": "#8172b3",
            "reverse_chi_square": "#937860", "kl+q": "#4c72b0", "alpha1.5+q": "#55a868"}


def write_figures(results: dict, out_dir: Path) -> list:
    plt = pyplot()
    if plt is None:
        return []
    figs = [_accuracy_figure(plt, results, out_dir), _curves_figure(plt, results, out_dir),
            _decoding_figure(plt, results, out_dir), _cost_figure(plt, results, out_dir)]
    return [f for f in figs if f]


def _accuracy_figure(plt: Any, results: dict, out_dir: Path) -> str:
    L, C, paper = results["losses"], _colors(), results["paper"]["table3"]
    keys = list(L)
    fig, axes = plt.subplots(1, 2, figsize=(13, 4.4), gridspec_kw={"width_ratios": [1.6, 1]})
    ax = axes[0]
    for i, k in enumerate(keys):
        a = L[k]["test"]["accuracy"]
        ax.bar(i, a["mean"], 0.7, yerr=a["std"], capsize=4, color=C.get(k, "grey"), alpha=0.85,
               hatch="//" if k.endswith("+q") else "", edgecolor="black", linewidth=0.5)
        ax.scatter([i] * len(a["runs"]), a["runs"], color="black", s=10, zorder=3)
    ax.set_xticks(range(len(keys)), [loss_label(k) for k in keys], rotation=20, ha="right", fontsize=8)
    vals = [v for k in keys for v in L[k]["test"]["accuracy"]["runs"]]
    lo, hi = min(vals), max(vals)
    ax.set_ylim(max(0, lo - 0.25 * (hi - lo) - 1), hi + 0.15 * (hi - lo) + 0.5)
    ax.set_ylabel("test next-token accuracy (%)")
    ax.set_title("Penn Treebank, small decoder: mean ± std over seeds (dots: seeds)", fontsize=9)
    ax = axes[1]
    t3 = [k for k in TABLE3 if k in L and k != "kl" and "kl" in L]
    x = np.arange(len(t3))
    ours = [L[k]["valid"]["accuracy"]["mean"] - L["kl"]["valid"]["accuracy"]["mean"] for k in t3]
    err = [_diff_std(L[k]["valid"]["accuracy"]["runs"], L["kl"]["valid"]["accuracy"]["runs"]) for k in t3]
    ax.bar(x - 0.2, ours, 0.4, yerr=err, capsize=4, label="ours (PTB, validation)", color="#4c72b0")
    ax.bar(x + 0.2, [paper[k] - paper["kl"] for k in t3], 0.4, label="paper (C4, 1.2B, validation)", color="#c44e52")
    ax.axhline(0, color="black", linewidth=0.8)
    ax.set_xticks(x, [SHORT[k] for k in t3])
    ax.set_ylabel("accuracy − KL's (points)")
    ax.set_title("Difference to KL (cf. Roulet et al., 2025, Table 3)", fontsize=9)
    ax.legend(fontsize=8, loc="upper center", bbox_to_anchor=(0.5, -0.1), ncol=2)
    fig.tight_layout()
    save_figure(fig, out_dir / "accuracy.png", dpi=120)
    plt.close(fig)
    return "accuracy.png"


def _diff_std(a: list, b: list) -> float:
    """Standard deviation over seeds of the per-seed differences (0 for one seed)."""
    d = [x - y for x, y in zip(a, b)]
    return statistics.stdev(d) if len(d) > 1 else 0.0


def _curves_figure(plt: Any, results: dict, out_dir: Path) -> str:
    """Validation accuracy against tokens seen (millions), mean over seeds: the whole run, and beside it the last
    40% of the steps at a scale that shows the plateau window (shaded)."""
    R, C = results["runs"], _colors()
    fig, (ax, zoom) = plt.subplots(1, 2, figsize=(11, 4.6), gridspec_kw={"width_ratios": [3, 2]})
    by_key: dict[str, list[list]] = {}
    for r in R.values():
        by_key.setdefault(f"{r['loss']}+q" if r["learned_q"] else r["loss"], []).append(r["accuracy_curve"])
    st = results["settings"]
    tps = st["tokens_per_step"]
    P = plateau(results)
    steps_all = st["train"]["steps"]
    zoom_from = 0.6 * steps_all
    zoomed: list[float] = []
    for k, curves in by_key.items():
        steps = [s for s, _ in curves[0]]
        mean = [statistics.fmean(c[i][1] for c in curves) for i in range(len(steps))]
        verdict = "plateau" if P[k]["converged"] else "still rising"
        style = dict(marker="o", markersize=3, color=C.get(k, "grey"), linestyle="--" if k.endswith("+q") else "-")
        ax.plot([s * tps / 1e6 for s in steps], mean, **style,
                label=f"{loss_label(k)} ({len(curves)} seed{'s' if len(curves) > 1 else ''}; {P[k]['rise']:+.2f} "
                      f"from step {P[k]['from_step']:,}: {verdict})")
        late = [(s, m) for s, m in zip(steps, mean) if s >= zoom_from]
        zoom.plot([s * tps / 1e6 for s, _ in late], [m for _, m in late], **style)
        zoomed += [m for _, m in late]
    for a in (ax, zoom):
        a.axvspan((1 - PLATEAU_SHARE) * steps_all * tps / 1e6, steps_all * tps / 1e6, color="grey", alpha=0.12,
                  linewidth=0)
        a.set_xlabel("training tokens seen (millions)")
        a.grid(alpha=0.3)
    if zoomed:  # at least the criterion's 0.3 points visible, so that a flat curve looks flat
        lo, hi = min(zoomed), max(zoomed)
        pad = max(0.15, 0.1 * (hi - lo))
        zoom.set_ylim(lo - pad, max(hi + pad, lo + 2 * PLATEAU_POINTS))
    ax.set_ylabel(f"accuracy (%) on the first {min(st['train']['curve_tokens'], st['valid_tokens']):,} validation tokens")
    ax.set_title("Validation accuracy against tokens seen (mean over seeds)", fontsize=9)
    zoom.set_title(f"The last 40% of the steps; shaded: the last {100 * PLATEAU_SHARE:.0f}%,\n"
                   f"where a converged loss rises by < {PLATEAU_POINTS} points", fontsize=8)
    fig.legend(*ax.get_legend_handles_labels(), fontsize=8, loc="lower center", ncol=min(3, len(by_key)),
               bbox_to_anchor=(0.5, 0.0))
    fig.tight_layout(rect=(0, 0.08 + 0.04 * ((len(by_key) - 1) // 3), 1, 1))
    save_figure(fig, out_dir / "curves.png", dpi=120)
    plt.close(fig)
    return "curves.png"


def _decoding_figure(plt: Any, results: dict, out_dir: Path) -> Optional[str]:
    D, L, C = results["decoding"], results["losses"], _colors()
    keys = [k for k in D["models"]]
    if not keys:
        return None
    x = np.arange(len(keys))
    fig, axes = plt.subplots(1, 3, figsize=(15, 4.2))
    ax = axes[0]
    ax.bar(x - 0.2, [L[k]["valid"]["mean_p_true"]["mean"] for k in keys], 0.4, label="own f-softargmax",
           color=[C[k] for k in keys])
    ax.bar(x + 0.2, [L[k]["valid"]["mean_p_true_softmax"]["mean"] for k in keys], 0.4, label="classical softargmax",
           color=[C[k] for k in keys], hatch="//", alpha=0.5, edgecolor="black", linewidth=0.5)
    ax.set_xticks(x, [SHORT[k] for k in keys], fontsize=8)
    ax.set_title("mean probability of the true next token (validation)\n= expected accuracy of a sampled token",
                 fontsize=9)
    ax.legend(fontsize=8)
    ax = axes[1]
    for off, rule, hatch in ((-0.2, "own", ""), (0.2, "softmax", "//")):
        ax.bar(x + off, [D["models"][k][rule]["distinct_2"] for k in keys], 0.4, hatch=hatch,
               color=[C[k] for k in keys], alpha=1 if rule == "own" else 0.5, edgecolor="black", linewidth=0.5,
               label="own f-softargmax" if rule == "own" else "classical softargmax")
    ax.axhline(D["human"]["distinct_2"], color="black", linestyle="--", linewidth=1, label="the true continuations")
    ax.set_xticks(x, [SHORT[k] for k in keys], fontsize=8)
    ax.set_title("distinct-2 of temperature-1 samples", fontsize=9)
    ax.legend(fontsize=8, loc="lower right")
    ax = axes[2]
    ax.bar(x, [L[k]["valid"]["support_mean"]["mean"] for k in keys], 0.6, color=[C[k] for k in keys])
    ax.set_yscale("log")
    ax.set_xticks(x, [SHORT[k] for k in keys], fontsize=8)
    ax.set_title(f"mean support size of p (validation; vocabulary {results['settings']['vocab']:,})", fontsize=9)
    fig.suptitle("Decoding with the loss's f-softargmax or the classical softargmax (cf. Roulet et al., 2025, Fig. 4)",
                 fontsize=10)
    fig.tight_layout()
    save_figure(fig, out_dir / "decoding.png", dpi=120)
    plt.close(fig)
    return "decoding.png"


def _cost_figure(plt: Any, results: dict, out_dir: Path) -> str:
    T, M, C = results["step_time"]["systems"], results["memory"], _colors()
    fig, axes = plt.subplots(1, 2, figsize=(12, 4))
    keys = list(T)
    ax = axes[0]
    for i, k in enumerate(keys):
        ax.bar(i, T[k]["seconds_relative_to_kl"] or 0, color=C.get(k, "grey"), hatch="//" if k.endswith("+q") else "",
               edgecolor="black", linewidth=0.5)
    ax.axhline(1, color="black", linewidth=0.8)
    ax.set_xticks(range(len(keys)), [loss_label(k) for k in keys], rotation=20, ha="right", fontsize=8)
    ax.set_ylabel("time of a training step / KL's")
    ax.set_title("forward + fused loss + backward, interleaved medians (cf. Roulet et al., 2025, Fig. 7)", fontsize=9)
    ax = axes[1]
    maps = list(M["peak_mb"])
    x = np.arange(len(maps))
    ax.bar(x - 0.2, [M["peak_mb"][m]["unfused"] for m in maps], 0.4, label="unfused (logits stored)", color="#c44e52")
    ax.bar(x + 0.2, [M["peak_mb"][m]["fused"] for m in maps], 0.4, label=f"fused (chunks of {M['chunk']} tokens)",
           color="#4c72b0")
    ax.set_xticks(x, maps)
    ax.set_ylabel("peak memory growth (MiB)")
    ax.set_title(f"output layer + loss, forward and backward: {M['tokens']:,} tokens, d = {M['d']}, V = {M['vocab']:,}",
                 fontsize=9)
    ax.legend(fontsize=8)
    fig.tight_layout()
    save_figure(fig, out_dir / "cost.png", dpi=120)
    plt.close(fig)
    return "cost.png"
