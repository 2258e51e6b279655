#!/usr/bin/env python3
"""Why one step of delay hurts Adam, and how far prediction helps: the largest stable step.

On a quadratic with curvature h (per coordinate, after Adam's scaling), EMA momentum is
    m[k+1] = beta * m[k] + (1 - beta) * h * y[k],    x[k+1] = x[k] - lr * m[k+1],
with the gradient taken at y[k] = x[k-d] + f * (x[k-d] - x[k-d-1]): delay d (pd.staleness) and
prediction factor f (pd.stale_correction = "predict" serves f = d + 1/2). The recurrence is linear;
this prints the largest a = lr * h with spectral radius < 1. Optional tooling (python3-numpy).
    python3 perf/staleness_stability.py
"""
import numpy as np


def spectral_radius(a, beta, d, f):
    n = d + 2  # x[k] .. x[k-d-1], then m[k]
    A = np.zeros((n + 1, n + 1))
    m_row = np.zeros(n + 1)
    m_row[n] = beta
    m_row[d] += (1 - beta) * (1 + f)
    m_row[d + 1] += -(1 - beta) * f
    A[0] = -a * m_row
    A[0, 0] += 1.0
    for i in range(1, n):
        A[i, i - 1] = 1.0
    A[n] = m_row
    return max(abs(np.linalg.eigvals(A)))


def largest_stable_step(beta, d, f):
    lo, hi = 0.0, 200.0
    for _ in range(60):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if spectral_radius(mid, beta, d, f) < 1 else (lo, mid)
    return lo


if __name__ == "__main__":
    print("largest stable lr * curvature, EMA momentum")
    print("beta1  delay  plain   f = delay  f = delay + 1/2")
    for beta in (0.0, 0.9, 0.95):
        for d in (0, 1, 2, 3):
            plain = largest_stable_step(beta, d, 0.0)
            pred = largest_stable_step(beta, d, float(d))
            lead = largest_stable_step(beta, d, d + 0.5) if d > 0 else plain
            print(f"{beta:5.2f}  {d:5d}  {plain:6.2f}  {pred:9.2f}  {lead:15.2f}")
