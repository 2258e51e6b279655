#!/usr/bin/env python3
"""Why one step of delay hurts Adam, and how far prediction helps: the largest stable step.

On a quadratic with curvature h (per coordinate, after Adam's scaling), EMA momentum is
    m[k+1] = beta * m[k] + (1 - beta) * h * y[k],    x[k+1] = x[k] - lr * m[k+1],
with the gradient taken at the version served for step k, delay d (pd.staleness) behind:
    y[k] = x[k-d] + lead * u[k-d] + trend * (u[k-d] - u[k-d-1]),   u[j] = x[j] - x[j-1]
(pd.stale_correction: "none" lead = trend = 0; "predict" lead = d + 1/2; "trend" the
second-order coefficients below, where u[j] - u[j-1] = -lr (m[j] - m[j-1]) is the momentum's
last change, which the holders have in registers). The recurrence is linear; this prints the
largest a = lr * h with spectral radius < 1, and searches (lead, trend) for the most stable.
Optional tooling (python3-numpy).
    python3 perf/staleness_stability.py [--search]
"""
import sys

import numpy as np

# pd.stale_correction = "trend" (src/pd/staleness.cpp): the maxima of --search at beta1 0.9,
# rounded to quarters.
TREND = {1: (0.25, 1.0), 2: (0.75, 2.25), 3: (1.25, 4.0)}


def spectral_radius(a, beta, d, lead, trend):
    n = d + 3  # x[k] .. x[k-d-2], then m[k]
    A = np.zeros((n + 1, n + 1))
    m_row = np.zeros(n + 1)
    m_row[n] = beta
    # y = x[k-d] + (lead + trend) (x[k-d] - x[k-d-1]) - trend (x[k-d-1] - x[k-d-2])
    f1, f2 = lead + trend, -trend
    m_row[d] += (1 - beta) * (1 + f1)
    m_row[d + 1] += (1 - beta) * (-f1 + f2)
    m_row[d + 2] += (1 - beta) * (-f2)
    A[0] = -a * m_row
    A[0, 0] += 1.0
    for i in range(1, n):
        A[i, i - 1] = 1.0
    A[n] = m_row
    return max(abs(np.linalg.eigvals(A)))


def largest_stable_step(beta, d, lead=0.0, trend=0.0):
    lo, hi = 0.0, 200.0
    for _ in range(50):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if spectral_radius(mid, beta, d, lead, trend) < 1 else (lo, mid)
    return lo


def search(beta, d):
    """The most stable (lead, trend): a coarse grid, then a finer one around its best."""
    def best(leads, trends):
        return max((largest_stable_step(beta, d, l, t), l, t) for l in leads for t in trends)
    a, l0, t0 = best(np.arange(-0.5, d + 1.01, 0.125), np.arange(0.0, 5.01, 0.25))
    return best(np.arange(l0 - 0.25, l0 + 0.26, 0.05), np.arange(t0 - 0.25, t0 + 0.26, 0.05))


if __name__ == "__main__":
    print("largest stable lr * curvature, EMA momentum")
    print("beta1  delay  plain  lead = delay  lead = delay + 1/2  trend (lead, trend)")
    for beta in (0.0, 0.9, 0.95):
        for d in (0, 1, 2, 3):
            plain = largest_stable_step(beta, d)
            pred = largest_stable_step(beta, d, float(d))
            half = largest_stable_step(beta, d, d + 0.5) if d > 0 else plain
            lead, trend = TREND.get(d, (0.0, 0.0))
            tr = largest_stable_step(beta, d, lead, trend)
            print(f"{beta:5.2f}  {d:5d}  {plain:5.2f}  {pred:12.2f}  {half:18.2f}  {tr:5.2f} "
                  f"({lead}, {trend})")
    if "--search" in sys.argv:
        print("most stable (lead, trend) at beta1 0.9:")
        for d in (1, 2, 3):
            a, lead, trend = search(0.9, d)
            print(f"  delay {d}: lead {lead:.2f}, trend {trend:.2f}: {a:.2f}")
