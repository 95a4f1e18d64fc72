"""softargmax_jax's sampling against the PyTorch package's ``probabilities`` / ``log_probabilities`` on the
same float64 (1e-12) and float32 (1e-6) logits, with temperature and ``q``; draws only on the support and
with the frequencies of ``p`` (a fixed key, 20000 draws); under ``jit``; bad inputs raise."""

import numpy as np
import pytest

jax = pytest.importorskip("jax")
import jax.numpy as jnp  # noqa: E402
import softargmax_jax as sj  # noqa: E402
import torch  # noqa: E402
from softargmax_jax.sampling import log_probabilities, probabilities  # noqa: E402
from test_jax_operators import assert_close  # noqa: E402

from softargmax.operators import sampling as tsampling  # noqa: E402


@pytest.mark.parametrize("mapping,kw", [("sparsemax", {}), ("entmax15", {"temperature": 0.7}), ("softmax", {}),
                                        ("entmax", {"alpha": 1.3}), ("jensen_shannon", {"q": True})])
def test_probabilities_match_pytorch(x64, mapping, kw):
    rng = np.random.default_rng(0)
    x = rng.normal(size=(4, 8)) * 2
    x[1, 2] = -np.inf
    q = rng.uniform(0.5, 2.0, size=8)
    jkw = {k: jnp.asarray(q) if k == "q" else v for k, v in kw.items()}
    tkw = {k: torch.tensor(q) if k == "q" else v for k, v in kw.items()}
    for dtype, tol in ((np.float64, 1e-12), (np.float32, 1e-6)):
        pj = np.asarray(probabilities(jnp.asarray(x.astype(dtype)), mapping, **jkw))
        pt = tsampling.probabilities(torch.tensor(x.astype(dtype)), mapping, **tkw).numpy()
        assert pj.dtype == dtype
        assert_close(pj, pt, tol)
        lj = np.asarray(log_probabilities(jnp.asarray(x.astype(dtype)), mapping, **jkw))
        lt = tsampling.log_probabilities(torch.tensor(x.astype(dtype)), mapping, **tkw).numpy()
        # in float32, log p turns the relative rounding of a tiny p into an absolute error: compare exp(log p)
        assert np.array_equal(np.isneginf(lj), np.isneginf(lt))
        assert_close(lj if dtype == np.float64 else np.exp(lj), lt if dtype == np.float64 else np.exp(lt), tol)


def test_sample_support_and_frequencies(x64):
    logits = jnp.array([[2.0, 1.8, 0.0, -1.0], [0.0, 0.3, 1.0, -jnp.inf]])
    draws = np.asarray(jax.jit(lambda k, t: sj.sample(k, t, "sparsemax", num_samples=20000))(jax.random.key(0),
                                                                                             logits))
    assert draws.shape == (2, 20000)
    p = np.asarray(probabilities(logits, "sparsemax"))
    for row in range(2):
        freq = np.bincount(draws[row], minlength=4) / draws.shape[1]
        assert np.all(freq[p[row] == 0] == 0)  # never off the support
        assert np.max(np.abs(freq - p[row])) < 0.02  # 20000 draws: standard error < 0.004
    assert sj.sample(jax.random.key(1), logits[0]).shape == (1,)


def test_sampling_errors():
    with pytest.raises(ValueError, match="no finite"):
        probabilities(jnp.array([[-jnp.inf, -jnp.inf], [0.0, 1.0]]))
    with pytest.raises(ValueError, match="NaN"):
        probabilities(jnp.array([jnp.nan, 1.0]))
    with pytest.raises(ValueError, match="num_samples"):
        sj.sample(jax.random.key(0), jnp.zeros(3), num_samples=0)
    with pytest.raises(ValueError, match="alpha"):
        probabilities(jnp.zeros(3), "sparsemax", alpha=1.5)
