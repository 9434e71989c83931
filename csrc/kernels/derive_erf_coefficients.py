"""Derives the coefficients of erf and erfc in vector_math.cc (needs mpmath).

  python3 csrc/kernels/derive_erf_coefficients.py   # prints the C++ tables

Both are Chebyshev interpolants of smooth functions, computed in 80-digit
arithmetic at Chebyshev nodes, truncated where their coefficients fall below
1e-20 (the functions are of order 1, so that is far below double's 1.1e-16)
and rewritten in powers of a local variable, which Horner's rule evaluates
with error near the last term's rounding:

- erf(x) = x P(x^2) for |x| < 1. P(u) = erf(sqrt u) / sqrt u is entire; in
  powers of u its coefficients alternate and decay like the Taylor series'.
  Its constant term is split in two doubles (hi + lo), so that x times it is
  exact in a fused multiply-add.

- erfc(z) = exp(-z^2) t H(s) for 0.47 <= z, with t = 4 / (4 + z) in (0, 1]
  and s = 2t - 1 in [-1, 1]: H(s) = erfc(z) exp(z^2) / t is smooth on
  [-1, 1] (1 at z = 0, 1 / (4 sqrt(pi)) as z -> inf). It is fitted on four
  pieces of s and written in powers of d = s - center, each piece's centre a
  short binary fraction (so 1 + center, which the kernel subtracts, is
  exact) and its constant term split in hi + lo.
"""

import mpmath as mp

mp.mp.dps = 80
TOLERANCE = mp.mpf("1e-20")
# Pieces of s for H: (low, high, center); the last reaches s(0.47) = 0.7898.
PIECES = [(-1, -0.5, -0.75), (-0.5, 0, -0.25), (0, 0.5, 0.25), (0.5, 0.8, 0.625)]


def chebyshev(f, a, b, n):
    """Coefficients of the degree n-1 Chebyshev interpolant of f on [a, b]."""
    a, b = mp.mpf(a), mp.mpf(b)
    nodes = [mp.cos(mp.pi * (k + mp.mpf(1) / 2) / n) for k in range(n)]
    values = [f((b - a) / 2 * x + (b + a) / 2) for x in nodes]
    c = [2 * mp.fsum(values[k] * mp.cos(mp.pi * j * (k + mp.mpf(1) / 2) / n) for k in range(n)) / n
         for j in range(n)]
    c[0] /= 2
    last = max(j for j, v in enumerate(c) if abs(v) > TOLERANCE)
    return c[: last + 1]


def poly_mul(p, q):
    return [mp.fsum(p[i] * q[k - i] for i in range(len(p)) if 0 <= k - i < len(q))
            for k in range(len(p) + len(q) - 1)]


def in_powers(c, a, b, center):
    """Chebyshev series `c` on [a, b] as coefficients of powers of (x - center)."""
    a, b, center = mp.mpf(a), mp.mpf(b), mp.mpf(center)
    half, mid = (b - a) / 2, (b + a) / 2
    v = [(center - mid) / half, 1 / half]  # the Chebyshev variable in powers of d
    T = [[mp.mpf(1)], v]
    while len(T) < len(c):
        twice = [2 * x for x in poly_mul(v, T[-1])]
        prev = T[-2] + [mp.mpf(0)] * (len(twice) - len(T[-2]))
        T.append([x - y for x, y in zip(twice, prev)])
    out = [mp.mpf(0)] * len(c)
    for j, cj in enumerate(c):
        for i, t in enumerate(T[j]):
            out[i] += cj * t
    return out


def erf_p(u):
    r = mp.sqrt(u)
    return mp.erf(r) / r


def erfc_h(s):
    t = (s + 1) / 2
    z = 4 / t - 4
    return mp.erfc(z) * mp.exp(z * z) / t


def double(x):
    return mp.nstr(x, 20, min_fixed=0, max_fixed=0)


def hi_lo(x):
    hi = mp.mpf(float(x))
    return double(hi), double(x - hi)


def main():
    p = in_powers(chebyshev(erf_p, 0, 1, 40), 0, 1, 0)
    hi, lo = hi_lo(p[0])
    print(f"constexpr double kErfP0Hi = {hi};\nconstexpr double kErfP0Lo = {lo};")
    print(f"constexpr double kErfP[] = {{{', '.join(double(x) for x in p[1:])}}};")
    print("constexpr ErfcPiece kErfcPieces[] = {")
    for low, high, center in PIECES:
        h = in_powers(chebyshev(erfc_h, low, high, 50), low, high, center)
        hi, lo = hi_lo(h[0])
        rest = ", ".join(double(x) for x in h[1:])
        print(f"    {{{center}, {hi}, {lo}, {len(h) - 1}, {{{rest}}}}},")
    print("};")


if __name__ == "__main__":
    main()
