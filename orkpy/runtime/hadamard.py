"""Hadamard matrices and the fast rotation by one (the rotated source's, :mod:`orkpy.runtime.rotate`).

:func:`hadamard` ``(n)``: a Hadamard matrix of order ``n = p * 2^k`` (entries +-1, ``H H^T = n I``) as
``kron(H_p, H_{2^k})``: ``H_p`` from Paley's constructions (:func:`paley`: ``p = q + 1`` for a prime
``q = 3 mod 4``, Paley I; ``p = 2 (q + 1)`` for a prime ``q = 1 mod 4``, Paley II; ``p = 1``), ``H_{2^k}``
Sylvester's; None for an order none of these reach. :func:`fast_of` recognises the rotations
``diag(signs) H / sqrt(n)`` built from it and applies them as :class:`FastRotation`: the butterfly of
csrc/ork/hadamard.h on each block of ``2^k`` values and a ``p x p`` mix of the blocks, ``n log2(2^k) + n p``
operations per row instead of ``n^2``, equal to the dense product to float64 rounding.
"""
from __future__ import annotations

from typing import Any, Optional, Tuple

import numpy as np
from numpy.typing import NDArray

from .. import _core

def _is_prime(n: int) -> bool:
    if n < 2:
        return False
    f = 2
    while f * f <= n:
        if n % f == 0:
            return False
        f += 1
    return True


def _jacobsthal(q: int) -> NDArray[np.float64]:
    """Q_ij = chi(j - i) for a prime q (chi: the quadratic character mod q, chi(0) = 0)."""
    chi = np.full(q, -1.0)
    chi[0] = 0.0
    chi[[(x * x) % q for x in range(1, q)]] = 1.0
    idx = (np.arange(q)[None, :] - np.arange(q)[:, None]) % q
    return chi[idx]


def paley(p: int) -> Optional[NDArray[np.float64]]:
    """A Hadamard matrix of order p by Paley's constructions (I: p - 1 a prime = 3 mod 4;
    II: p / 2 - 1 a prime = 1 mod 4), else None."""
    q = p - 1
    if _is_prime(q) and q % 4 == 3:
        c = np.zeros((p, p))
        c[0, 1:], c[1:, 0], c[1:, 1:] = 1.0, -1.0, _jacobsthal(q)
        return np.eye(p) + c
    if p % 2 == 0:
        q = p // 2 - 1
        if _is_prime(q) and q % 4 == 1:
            c = np.zeros((q + 1, q + 1))
            c[0, 1:], c[1:, 0], c[1:, 1:] = 1.0, 1.0, _jacobsthal(q)
            return np.kron(c, np.array([[1.0, 1.0], [1.0, -1.0]])) + np.kron(np.eye(q + 1),
                                                                            np.array([[1.0, -1.0], [-1.0, -1.0]]))
    return None


def hadamard_factors(n: int) -> Optional[Tuple[int, int]]:
    """(p, 2^k) with n = p * 2^k and a Hadamard matrix of order p that :func:`hadamard`
    builds (the smallest such p), or None."""
    if n < 1:
        return None
    k = 0
    while n % (2 << k) == 0:
        k += 1
    for j in range(k, -1, -1):
        p = n >> j
        if p == 1 or (p % 4 == 0 and paley(p) is not None):
            return p, 1 << j
    return None


def hadamard(n: int) -> Optional[NDArray[np.float64]]:
    """A Hadamard matrix of order n (entries +-1, ``H H^T = n I``), float64, or None when
    none is built for n: ``H_p (Paley) kron H_{2^k} (Sylvester)`` (see the module doc)."""
    f = hadamard_factors(n)
    if f is None:
        return None
    p, two = f
    h: NDArray[Any] = np.ones((1, 1))
    while h.shape[0] < two:
        h = np.block([[h, h], [h, -h]])
    if p > 1:
        hp = paley(p)
        assert hp is not None
        h = np.kron(hp, h)
    if not np.array_equal(h @ h.T, n * np.eye(n)):  # the constructions are exact in float64
        raise AssertionError(f"Hadamard construction of order {n} failed")
    return h


class FastRotation:
    """``a @ M`` for float64 rows and ``M = diag(signs) kron(H_p, H_m) / sqrt(n)`` (the matrices this
    module builds) by the fast transform of csrc/ork/hadamard.h: ``n log2(m) + n p`` operations per
    row instead of ``n^2``; equal to the dense product to float64 rounding."""

    def __init__(self, signs: NDArray[np.float64], hp: Optional[NDArray[np.float64]], scale: float) -> None:
        self.signs, self.hp, self.scale = signs, hp, float(scale)

    def right(self, a: NDArray[Any], cols: Optional[NDArray[np.float64]] = None) -> NDArray[np.float64]:
        """``(a diag(cols)) @ M`` of rows ``a`` (2-D, or one 1-D row; ``cols`` None: ones), a new
        float64 array (the column factor and the signs in one pass: times +-1 is exact)."""
        f = self.signs if cols is None else np.asarray(cols, np.float64) * self.signs
        a = np.asarray(a)
        x = np.multiply(a.reshape(1, -1) if a.ndim == 1 else a, f, dtype=np.float64, order="C")  # one new array
        _core.hadamard_rows(x, self.hp, self.scale)
        return x if a.ndim == 2 else x[0]

    def left_t(self, a: NDArray[Any]) -> NDArray[np.float64]:
        """``M^T @ a`` of a column-side tensor ``a`` ((n, K) or (n,)): a Fortran-ordered view of one
        new array (the caller's float32 conversion makes the one copy)."""
        if np.ndim(a) == 1:
            return self.right(a)
        return self.right(np.asarray(a).T).T


def fast_of(m: Optional[NDArray[np.float64]]) -> Optional[FastRotation]:
    """The :class:`FastRotation` form of ``m`` when it is exactly ``diag(signs) H / sqrt(n)`` as :func:`rotation`
    (or ``H / sqrt(n)``, signs 1) builds it from :func:`hadamard`; else None (a dense product then)."""
    if m is None or m.ndim != 2 or m.shape[0] != m.shape[1]:
        return None
    n = m.shape[0]
    h, f = hadamard(n), hadamard_factors(n)
    if h is None or f is None:
        return None
    signs = np.sign(m[:, 0]) * h[:, 0]
    if not np.array_equal(m, signs[:, None] * h / np.sqrt(n)):
        return None
    hp = paley(f[0]) if f[0] > 1 else None
    return FastRotation(signs, hp, 1.0 / np.sqrt(n))


def right_product(a: NDArray[Any], m: NDArray[np.float64], fast: Optional[FastRotation],
         cols: Optional[NDArray[np.float64]] = None) -> NDArray[np.float64]:
    """``(a diag(cols)) @ m`` in float64 (``cols`` None: ``a @ m``), fast when ``fast`` is ``m``'s
    :func:`fast_of`."""
    if fast is not None:
        return fast.right(a, cols)
    a = np.asarray(a, np.float64)
    return (a if cols is None else a * cols[None, :]) @ m


__all__ = ["FastRotation", "fast_of", "hadamard", "hadamard_factors", "paley", "right_product"]
