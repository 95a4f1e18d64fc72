"""
Sparse outputs versus softmax
=============================

Softmax gives every class a positive probability; sparsemax, 1.5-entmax and α-entmax with
:math:`\\alpha > 1` give exact zeros to the classes whose scores fall below a threshold
:math:`\\tau`.  This example compares them on one row of scores, then draws the probability of
the first of two classes as its score :math:`t` varies (the other score is 0): softmax is the
logistic sigmoid, sparsemax reaches 0 and 1 at :math:`t = \\mp 1`.
"""

import matplotlib.pyplot as plt
import torch

import softargmax as sa

x = torch.tensor([2.0, 1.6, 0.9, 0.3, -0.5, -1.2])
outputs = {
    "softmax": torch.softmax(x, -1),
    "1.5-entmax": sa.entmax15(x),
    "α-entmax, α = 1.8": sa.entmax(x, alpha=1.8),
    "sparsemax": sa.sparsemax(x),
}
for name, p in outputs.items():
    print(f"{name:>18}: {[round(v, 3) for v in p.tolist()]}   zeros: {int((p == 0).sum())}")

# %%
# The same scores, four normalizations: the sparse ones keep the two or three largest scores.

fig, ax = plt.subplots(figsize=(7, 3.6))
width = 0.2
for i, (name, p) in enumerate(outputs.items()):
    ax.bar(torch.arange(len(x)) + (i - 1.5) * width, p, width, label=name)
ax.set_xticks(range(len(x)), [f"{v:g}" for v in x.tolist()])
ax.set_xlabel("score $x_j$")
ax.set_ylabel("probability $p_j$")
ax.legend(fontsize=8)
fig.tight_layout()
plt.show()

# %%
# The two-class case: :math:`p_1` of the scores :math:`(t, 0)`.

t = torch.linspace(-3, 3, 301)
scores = torch.stack([t, torch.zeros_like(t)], dim=-1)
mappings = {
    "softmax": lambda s: torch.softmax(s, -1),
    "1.5-entmax": sa.entmax15,
    "α-entmax, α = 1.8": lambda s: sa.entmax(s, alpha=1.8),
    "sparsemax": sa.sparsemax,
}
fig, ax = plt.subplots(figsize=(7, 3.6))
for name, fn in mappings.items():
    ax.plot(t, fn(scores)[:, 0], label=name)
ax.set_xlabel("$t$")
ax.set_ylabel("$p_1$ of $(t, 0)$")
ax.legend(fontsize=8)
fig.tight_layout()
plt.show()
