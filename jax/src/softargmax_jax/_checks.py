"""Argument checks shared by the operators and the losses: clear errors where JAX can check (shapes,
dtypes, and values that are not traced)."""

from __future__ import annotations

import math
from typing import Any, Optional

import jax
import jax.numpy as jnp
import numpy as np

Array = jax.Array


def is_concrete(x: Any) -> bool:
    """Whether the values of ``x`` can be read now (not a tracer under ``jit``/``vmap``/``grad``)."""
    return not isinstance(x, jax.core.Tracer)


def concrete(x: Any) -> Optional[np.ndarray]:
    """The values of ``x`` as a NumPy array (float32 for half precision), or ``None`` where they are traced."""
    if not is_concrete(x):
        return None
    v = np.asarray(x)
    return v.astype(np.float32) if v.dtype.kind == "f" and v.dtype.itemsize < 4 else v


def check_array(x: Any, name: str = "x") -> Array:
    """``x`` as a floating JAX array, or a ``TypeError`` naming the argument."""
    if not isinstance(x, (jax.Array, jax.core.Tracer)) and not hasattr(x, "__array__"):
        raise TypeError(f"{name} must be an array, got {type(x).__name__}")
    x = jnp.asarray(x)
    if not jnp.issubdtype(x.dtype, jnp.floating):
        raise TypeError(f"{name} must have a floating dtype, got {x.dtype}")
    return x


def check_axis(x: Array, axis: Any, name: str = "axis") -> int:
    """``axis`` as a non-negative index of ``x``'s dimensions, or an error naming it."""
    if isinstance(axis, bool) or not isinstance(axis, int):
        raise TypeError(f"{name} must be an int, got {type(axis).__name__}")
    if x.ndim == 0:
        raise ValueError(f"x must have at least one dimension to normalize along {name}={axis}")
    if not -x.ndim <= axis < x.ndim:
        raise ValueError(f"{name}={axis} is out of range for an array of {x.ndim} dimensions")
    return axis % x.ndim


def compute_dtype(dtype: Any) -> Any:
    """float16/bfloat16 are computed in float32; float32 and float64 as they are."""
    return jnp.float32 if jnp.dtype(dtype).itemsize < 4 else dtype


def check_positive(value: Any, name: str) -> Any:
    """A number (or an array) that must be finite and > 0: checked where its value can be read."""
    if isinstance(value, bool):
        raise TypeError(f"{name} must be a number > 0, got a bool")
    if isinstance(value, (int, float)):
        if not (value > 0 and math.isfinite(value)):
            raise ValueError(f"{name} must be a finite number > 0, got {value}")
        return float(value)
    value = jnp.asarray(value)
    if not jnp.issubdtype(value.dtype, jnp.floating):
        raise TypeError(f"{name} must be a number or a floating array, got {value.dtype}")
    v = concrete(value)
    if v is not None and not bool(np.all((v > 0) & np.isfinite(v))):
        raise ValueError(f"{name} must be finite and > 0 everywhere")
    return value


def check_q(q: Optional[Any], x: Array, name: str = "q") -> Optional[Array]:
    """A reference measure: ``None`` or a finite, strictly positive floating array broadcastable to ``x``."""
    if q is None:
        return None
    q = check_array(q, name)
    try:
        jnp.broadcast_shapes(q.shape, x.shape)
    except ValueError:
        raise ValueError(f"{name} of shape {q.shape} is not broadcastable to x of shape {x.shape}") from None
    if len(q.shape) > x.ndim:
        raise ValueError(f"{name} of shape {q.shape} has more dimensions than x {x.shape}")
    v = concrete(q)
    if v is not None and not bool(np.all((v > 0) & np.isfinite(v))):
        raise ValueError(f"{name} must be finite and strictly positive everywhere (a reference measure)")
    return q


def check_row_param(value: Any, x: Array, axis: int, name: str, minimum: float = 0.0,
                    strict: bool = True) -> Array:
    """A per-row parameter (one α or one budget per row): a floating array with size 1 along ``axis`` and
    broadcastable to ``x``'s other dimensions, finite and ``> minimum`` (``>= minimum`` unless ``strict``)
    where its values can be read; returned broadcast to ``x``'s shape with size 1 along ``axis``."""
    if isinstance(value, bool) or not (isinstance(value, (jax.Array, jax.core.Tracer)) or hasattr(value, "__array__")):
        raise TypeError(f"{name} must be a number or a floating array, got {type(value).__name__}")
    v = concrete(value)  # before jnp.asarray, which under a transformation's tracing may make a constant traced
    value = jnp.asarray(value)
    if not jnp.issubdtype(value.dtype, jnp.floating):
        raise TypeError(f"{name} must be a number or a floating array, got dtype {value.dtype}")
    if value.ndim > x.ndim:
        raise ValueError(f"{name} of shape {value.shape} has more dimensions than x {x.shape}")
    shape = list(x.shape)
    shape[axis] = 1
    full = (1,) * (x.ndim - value.ndim) + tuple(value.shape)
    if full[axis] != 1 or any(a not in (1, b) for a, b in zip(full, shape)):
        raise ValueError(f"{name} of shape {value.shape} must be broadcastable to x's shape {x.shape} with size 1 "
                         f"along axis={axis - x.ndim} (one value per row)")
    if v is not None and v.size:
        bad = (v <= minimum) if strict else (v < minimum)
        if bool(np.any(bad | ~np.isfinite(v))):
            op = ">" if strict else ">="
            raise ValueError(f"{name} must be finite and {op} {minimum}, got values in [{v.min()}, {v.max()}]")
    return jnp.broadcast_to(value, tuple(shape))
