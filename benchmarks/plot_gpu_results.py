"""Tables and a figure from one GPU session's benchmark JSON (the files ``gpu_all.sh`` brings back).

Usage::

    python benchmarks/plot_gpu_results.py benchmarks/results/gpu-h100-2026-11-28 \
        --png docs/_static/gpu-h100-2026-11-28.png

prints the Markdown tables of the documentation's performance page (row operators and losses as
ratios to ``torch.softmax`` and ``F.cross_entropy`` timed in the same run, the peers' times with
their errors beside them, the fused output layer against its unfused path and its peers, attention
against SDPA and its peers, on random inputs and, where the run has them, on structured ones with their block
sparsity) and draws the ratios as one PNG.  The folder
holds ``call*/bench/gpu-*.json``; where two calls measured the same section, the later call's
file is read.  ``tests/test_gpu_results.py`` checks that the page shows what this script renders.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

OPERATOR_NAMES = {"sparsemax": "sparsemax", "entmax15": "1.5-entmax", "entmax_a1.3": "α = 1.3",
                  "f_jensen_shannon": "Jensen–Shannon", "f_squared_hellinger": "Hellinger", "alpha_relu": "α-ReLU"}
LOSS_NAMES = {"sparsemax_loss": "sparsemax", "entmax15_loss": "1.5-entmax", "entmax_loss_a1.3": "α = 1.3",
              "alpha_relu_loss": "α-ReLU", "entmax15_loss_ls0.1": "1.5-entmax, ε = 0.1 (vs smoothed CE)"}
FUSED_NAMES = {"ours_kl": "ours, KL (softmax)", "ours_entmax15": "ours, 1.5-entmax", "torch_linear_ce": "torch linear + CE",
               "liger_flce": "Liger fused linear CE", "cce": "Cut-Cross-Entropy"}
ATTENTION_NAMES = {"sdpa": "SDPA", "fused_entmax15": "ours, fused 1.5-entmax", "fused_learned_alpha": "ours, learned α",
                   "materialized_entmax15": "materialized 1.5-entmax", "adasplash2_a1.5": "AdaSplash-2",
                   "adasplash1_a1.5": "AdaSplash-1"}


def _shape(shape: list[int]) -> str:
    return "×".join(str(n) for n in shape)


def load_sections(folder: Path) -> dict[str, Any]:
    """The benchmark sections of a session's folder: ``{"operators": [...], "losses": [...], "peers": {...},
    "fused": {...}, "attention": [...], "environment": {...}}``, each from the latest call that has it."""
    found: dict[str, Any] = {}
    for path in sorted(folder.glob("call*/bench/gpu-*.json")):  # call1 before call2: later calls win
        data = json.loads(path.read_text())
        found["environment"] = data.get("environment") or found.get("environment")
        if data.get("cases"):
            found["operators"] = data["cases"]
        if data.get("loss_cases"):
            found["losses"] = data["loss_cases"]
        if data.get("fused"):
            found["fused"] = data["fused"]
        if data.get("peers"):
            found["peers"] = data["peers"]
        if data.get("attention"):
            found["attention"] = data["attention"]
    return found


def _ratio_table(cases: list[dict], names: dict[str, str], baseline: str, baseline_key: str) -> str:
    """Rows: shape and dtype; columns: the ``names`` present; cells: time ÷ the baseline's, timed in the same run."""
    ops = [op for op in names if any(c["op"] == op for c in cases)]
    keys = list(dict.fromkeys((tuple(c["shape"]), c["dtype"]) for c in cases))
    lines = [f"| shape | dtype | {baseline} (ms) | " + " | ".join(names[op] for op in ops) + " |",
             "|---|---|---|" + "---|" * len(ops)]
    for shape, dtype in keys:
        row = {c["op"]: c for c in cases if tuple(c["shape"]) == shape and c["dtype"] == dtype}
        plain = [c for c in row.values() if c.get("baseline", "cross_entropy") == "cross_entropy"]  # (not a smoothed CE)
        base = (plain or list(row.values()))[0][baseline_key]
        cells = [f"{row[op]['ratio']:.2f}×" if op in row else "–" for op in ops]
        lines.append(f"| {_shape(list(shape))} | {dtype} | {base:.3f} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def operator_table(cases: list[dict]) -> str:
    """Row operators: forward + backward time ÷ ``torch.softmax``'s on the same rows."""
    return _ratio_table(cases, OPERATOR_NAMES, "torch.softmax", "softmax_ms")


def loss_table(cases: list[dict]) -> str:
    """Losses: forward + backward time ÷ ``F.cross_entropy``'s on the same rows."""
    return _ratio_table(cases, LOSS_NAMES, "F.cross_entropy", "cross_entropy_ms")


def _peer_cell(case: dict) -> str:
    if case.get("peer_ms") is None:
        error = str(case.get("peer_max_abs_error", "")).split(":")[1].strip() if ":" in str(
            case.get("peer_max_abs_error", "")) else "failed"
        return f"fails ({error})"
    return f"{case['peer_ms']:.3f} ms (max error {float(case['peer_max_abs_error']):.1e})"


def peer_table(cases: list[dict]) -> str:
    """Ours and each peer on the same rows, forward + backward, the peer's largest error beside its time."""
    lines = ["| operator | shape | dtype | ours (ms) | AdaSplash | Liger-Kernel |", "|---|---|---|---|---|---|"]
    keys = list(dict.fromkeys((c["op"], tuple(c["shape"]), c["dtype"]) for c in cases))
    for op, shape, dtype in keys:
        by_peer = {c["peer"]: c for c in cases if (c["op"], tuple(c["shape"]), c["dtype"]) == (op, shape, dtype)}
        ours = next(iter(by_peer.values()))["ours_ms"]
        cells = [_peer_cell(by_peer[p]) if p in by_peer else "–" for p in ("adasplash", "liger")]
        lines.append(f"| {OPERATOR_NAMES.get(op, op)} | {_shape(list(shape))} | {dtype} | {ours:.3f} | "
                     + " | ".join(cells) + " |")
    return "\n".join(lines)


def fused_table(cases: list[dict]) -> str:
    """The fused output layer against its peers: time and peak extra memory, forward + backward."""
    shapes = list(dict.fromkeys(tuple(c["shape"]) for c in cases if "shape" in c))
    lines = ["| tokens × hidden × vocabulary | " + " | ".join(FUSED_NAMES.values()) + " |",
             "|---|" + "---|" * len(FUSED_NAMES)]
    for shape in shapes:
        row = {c["op"]: c for c in cases if tuple(c.get("shape", ())) == shape}
        cells = [f"{row[op]['ms']:.0f} ms, {row[op]['peak_extra_mb'] / 1024:.2f} GiB" if op in row else "–"
                 for op in FUSED_NAMES]
        lines.append(f"| {_shape(list(shape))} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def fused_own_table(case: dict) -> str:
    """The fused output layer against its own unfused path (linear, then the loss on the stored logits)."""
    lines = ["| loss | tokens × hidden × vocabulary | dtype | fused | unfused | time ratio | peak memory ratio |",
             "|---|---|---|---|---|---|---|"]
    f, u = case["fused"], case["unfused"]
    lines.append(f"| {case['op']} | {_shape(case['shape'])} | {case['dtype']} | {f['ms']:.1f} ms, "
                 f"{f['peak_extra_mb'] / 1024:.2f} GiB | {u['ms']:.1f} ms, {u['peak_extra_mb'] / 1024:.2f} GiB | "
                 f"{case['time_ratio']:.3f}× | {case['memory_ratio']:.3f}× |")
    return "\n".join(lines)


def attention_table(cases: list[dict]) -> str:
    """Attention, forward + backward: each implementation's time (÷ SDPA's, same run) and peak memory; "–" where
    an implementation did not run (or was stopped) in that case.  The random inputs' cases (the structured ones:
    :func:`structured_attention_table`)."""
    cases = [c for c in cases if c.get("inputs", "random") == "random"]
    names = [n for n in ATTENTION_NAMES if any(n in c["impls"] for c in cases)]
    lines = ["| mask | batch × heads × length × head dim | " + " | ".join(ATTENTION_NAMES[n] for n in names) + " |",
             "|---|---|" + "---|" * len(names)]
    for c in cases:
        sdpa = c["impls"].get("sdpa", {}).get("ms")
        cells = []
        for n in names:
            r = c["impls"].get(n) or {}
            if r.get("ms") is None:
                cells.append("–")
                continue
            ratio = f" ({r['ms'] / sdpa:.2f}×)" if sdpa and n != "sdpa" else ""
            cells.append(f"{r['ms']:.2f} ms{ratio}, {r['peak_mib']:.0f} MiB")
        lines.append(f"| {'causal' if c['causal'] else 'full'} | {_shape(c['shape'])} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def _heads(case: dict) -> str:
    b, h, L, D = case["shape"]
    kv = case.get("kv_heads") or h
    return f"{b}×{h}{f' (over {kv})' if kv != h else ''}×{L}×{D}"


def _ms_cell(case: dict, name: str) -> str:
    r = case["impls"].get(name) or {}
    sdpa = case["impls"].get("sdpa", {}).get("ms")
    if r.get("ms") is None:
        return "–"
    return f"{r['ms']:.2f} ms" + (f" ({r['ms'] / sdpa:.2f}×)" if sdpa and name != "sdpa" else "")


def structured_attention_table(cases: list[dict]) -> str:
    """Causal attention on structured inputs (a recency bias and attention sinks, with the knob λ: the
    benchmark's ``attention_inputs.py``) beside the random inputs of the same shapes: the block sparsity the
    fused 1.5-entmax kernels measured (the share of the causal band's score tiles they skipped), the time of
    SDPA, ours and AdaSplash-2 (÷ SDPA's), and ours ÷ AdaSplash-2's, forward + backward."""
    def layout(c: dict) -> tuple:  # the shape and the key/value heads (a case without kv_heads has as many as h)
        return tuple(c["shape"]), c.get("kv_heads") or c["shape"][1]

    structured = [c for c in cases if c.get("inputs") == "structured"]
    shapes = {layout(c) for c in structured}
    rows = [c for c in cases if c.get("inputs", "random") == "random" and c["causal"] and not c.get("window")
            and layout(c) in shapes] + structured
    rows.sort(key=lambda c: (c["shape"][3], layout(c)[1], c["shape"][2], c.get("locality", 0)))
    lines = ["| inputs | batch × heads × length × head dim | block sparsity | SDPA | ours, fused 1.5-entmax | "
             "AdaSplash-2 | ours ÷ AdaSplash-2 |", "|---|---|---|---|---|---|---|"]
    for c in rows:
        kind = f"structured, λ = {c['locality']:g}" if c.get("inputs") == "structured" else "random"
        sparsity = (c["impls"].get("fused_entmax15") or {}).get("block_sparsity")
        ours = (c["impls"].get("fused_entmax15") or {}).get("ms")
        peer = (c["impls"].get("adasplash2_a1.5") or {}).get("ms")
        lines.append(f"| {kind} | {_heads(c)} | {'–' if sparsity is None else f'{sparsity:.1%}'} | "
                     f"{_ms_cell(c, 'sdpa')} | {_ms_cell(c, 'fused_entmax15')} | {_ms_cell(c, 'adasplash2_a1.5')} | "
                     f"{f'{ours / peer:.2f}×' if ours and peer else '–'} |")
    return "\n".join(lines)


def render_tables(folder: Path) -> str:
    """The Markdown tables of one session's folder, in the order the performance page shows them."""
    sections = load_sections(folder)
    parts = []
    if "operators" in sections:
        parts.append(operator_table(sections["operators"]))
    if "losses" in sections:
        parts.append(loss_table(sections["losses"]))
    if "peers" in sections and sections["peers"].get("operators"):
        parts.append(peer_table(sections["peers"]["operators"]))
    if "fused" in sections:
        parts.append(fused_own_table(sections["fused"]))
    if "peers" in sections and sections["peers"].get("fused"):
        parts.append(fused_table(sections["peers"]["fused"]))
    if "attention" in sections:
        parts.append(attention_table(sections["attention"]))
        if any(c.get("inputs") == "structured" for c in sections["attention"]):
            parts.append(structured_attention_table(sections["attention"]))
    return "\n\n".join(parts) + "\n"


def draw(folder: Path, png: Path) -> None:
    """Ratios to ``torch.softmax`` (row operators) and ``F.cross_entropy`` (losses), one panel per dtype."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    sections = load_sections(folder)
    dtypes = ["float32", "bfloat16"]
    fig, axes = plt.subplots(1, 2, figsize=(13, 4.8), sharey=True)
    for ax, dtype in zip(axes, dtypes):
        labels: list[str] = []
        series: dict[str, list[float]] = {}
        ops = list(OPERATOR_NAMES) + list(LOSS_NAMES)
        shapes = list(dict.fromkeys(tuple(c["shape"]) for c in sections.get("operators", []) if c["dtype"] == dtype))
        for shape in shapes:
            labels.append(_shape(list(shape)))
            for op in ops:
                cases = sections.get("operators", []) + sections.get("losses", [])
                match = [c["ratio"] for c in cases if c["op"] == op and tuple(c["shape"]) == shape and c["dtype"] == dtype]
                series.setdefault(op, []).append(match[0] if match else float("nan"))
        width = 0.8 / len(ops)
        for i, op in enumerate(ops):
            name = OPERATOR_NAMES.get(op) or f"{LOSS_NAMES[op]} loss ÷ CE"
            xs = [j + (i - len(ops) / 2) * width + width / 2 for j in range(len(labels))]
            ax.bar(xs, series[op], width, label=name, hatch="//" if op in LOSS_NAMES else None)
        ax.axhline(1.0, color="black", linewidth=1)
        ax.set_xticks(range(len(labels)), labels)
        ax.set_title(f"{dtype}: forward + backward, ÷ the PyTorch baseline")
        ax.set_xlabel("rows × row length")
    axes[0].set_ylabel("time ÷ torch.softmax (operators) or F.cross_entropy (losses)")
    handles, names = axes[0].get_legend_handles_labels()
    fig.legend(handles, names, loc="lower center", ncol=min(len(names), 4), fontsize=8, frameon=False)
    device = (sections.get("environment") or {}).get("device", "GPU")
    fig.suptitle(f"{device}: time relative to PyTorch's own kernels, same run (lower is better; 1 = as fast)")
    fig.tight_layout(rect=(0, 0.06, 1, 1))
    png.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(png, dpi=110)
    plt.close(fig)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("folder", type=Path, help="a session's results folder, holding call*/bench/gpu-*.json")
    parser.add_argument("--png", type=Path, help="where to draw the figure")
    args = parser.parse_args()
    print(render_tables(args.folder))
    if args.png:
        draw(args.folder, args.png)


if __name__ == "__main__":
    main()
