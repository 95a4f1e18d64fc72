"""
Sparse attention weights
========================

:func:`softargmax.attention` is ``scaled_dot_product_attention`` with a choice of normalization.
With ``mapping="entmax15"`` or ``"sparsemax"`` each query attends to a few keys only; the other
weights are exactly zero.  A causal mask (``is_causal=True``) hides the future keys, and a row
with a single visible key gets weight 1 on it.
"""

import matplotlib.pyplot as plt
import torch

import softargmax as sa

torch.manual_seed(0)
L, E = 12, 16
query, key, value = torch.randn(3, 1, L, E).unbind(0)
weights = {}
for mapping in ["softmax", "entmax15", "sparsemax"]:
    out, w = sa.attention(query, key, value, is_causal=True, mapping=mapping, scale=0.5, return_weights=True)
    weights[mapping] = w[0]
    nonzero = (w[0] > 0).sum(-1).tolist()
    print(f"{mapping:>9}: keys attended per query {nonzero}")

# %%
# The ``[L, S]`` weight matrices (queries down, keys across); white entries are exactly zero.

fig, axes = plt.subplots(1, 3, figsize=(11, 3.8))
for ax, (mapping, w) in zip(axes, weights.items()):
    shown = w.masked_fill(w == 0, float("nan"))
    ax.imshow(shown, cmap="viridis", vmin=0, vmax=1)
    ax.set_title(f"{mapping}: {int((w > 0).sum())} non-zero weights", fontsize=10)
    ax.set_xlabel("key")
    ax.set_ylabel("query")
fig.tight_layout()
plt.show()
