"""The one mapping-name table (``softargmax.operators.mappings``): every name resolves to the generator
it stands for, ``normalize`` computes the operator that name denotes, and bad names or
parameters are refused by name."""

import pytest
import torch

import softargmax as sa
from softargmax.divergences import DIVERGENCE_NAMES, Divergence, get_divergence
from softargmax.operators.mappings import MAPPING_NAMES, normalize, resolve

X = torch.randn(5, 9, dtype=torch.float64) * 2


@pytest.mark.parametrize("name, reference", [
    ("softmax", lambda x: torch.softmax(x, -1)),
    ("sparsemax", sa.sparsemax),
    ("entmax15", sa.entmax15),
    ("kl", lambda x: torch.softmax(x, -1)),
    ("chi_square", sa.sparsemax),
])
def test_named_mappings_are_the_operators_they_name(name, reference):
    torch.testing.assert_close(normalize(X, name), reference(X))


@pytest.mark.parametrize("name", ["entmax", "alpha"])
@pytest.mark.parametrize("alpha", [1.3, 1.5, 2.0])
def test_entmax_and_alpha_take_alpha(name, alpha):
    torch.testing.assert_close(normalize(X, name, alpha), sa.entmax(X, alpha))
    assert resolve(name, alpha).alpha == alpha


def test_a_tensor_alpha_goes_per_row():
    alpha = torch.tensor([1.1, 1.3, 1.5, 1.8, 2.0], dtype=torch.float64).unsqueeze(1)
    out = normalize(X, "entmax", alpha)
    for i in range(5):
        torch.testing.assert_close(out[i], sa.entmax(X[i], float(alpha[i])))
    torch.testing.assert_close(normalize(X, "alpha", alpha), out)


@pytest.mark.parametrize("name", DIVERGENCE_NAMES)
def test_every_divergence_name_is_a_mapping(name):
    assert name in MAPPING_NAMES
    params = {"alpha": 1.5} if name == "alpha" else {}
    div = resolve(name, params.get("alpha"))
    assert isinstance(div, Divergence) and type(div) is type(get_divergence(name, **params))
    torch.testing.assert_close(normalize(X, name, params.get("alpha")), sa.f_softargmax(X, name, **params))


def test_divergence_objects_pass_through():
    div = get_divergence("jensen_shannon")
    assert resolve(div) is not None
    torch.testing.assert_close(normalize(X, div), sa.f_softargmax(X, "jensen_shannon"))


def test_losses_and_attention_use_the_same_table():
    from softargmax.losses import MAPPINGS as LOSS_MAPPINGS
    from softargmax.operators.attention import MAPPINGS as ATTENTION_MAPPINGS

    assert ATTENTION_MAPPINGS == MAPPING_NAMES
    assert set(LOSS_MAPPINGS) == set(MAPPING_NAMES) | {"alpha_relu"}


def test_bad_names_and_parameters():
    with pytest.raises(ValueError, match="mapping: unknown name 'sparsmax'"):
        resolve("sparsmax")
    with pytest.raises(TypeError, match="mapping must be a name or a Divergence"):
        resolve(3)
    with pytest.raises(ValueError, match="needs alpha="):
        resolve("entmax")
    with pytest.raises(TypeError, match="alpha must be a number here"):
        resolve("alpha", torch.tensor(1.5))
