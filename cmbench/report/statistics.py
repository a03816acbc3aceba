"""Statistics of task scores: cluster-robust means, intervals and paired tests.

The tasks of one context video are not independent (two tasks share a video, and the seeds of one
task share it too), so every interval and test treats the context as the unit: with values ``x_i``
(task scores, or paired differences), their mean ``m``, ``n`` values and ``G`` contexts,

    se^2 = G / (G - 1) * sum_c (sum_{i in c} (x_i - m))^2 / n^2

(the CR1 cluster-robust variance of a mean), the 95% interval is ``m +- t_{0.975, G-1} * se`` and the
paired test of "no difference" is the cluster-robust t-test: ``t = m / se`` with ``G - 1`` degrees of
freedom, two-sided. Its p-value is below 0.05 exactly when the interval excludes 0.
"""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
from scipy import stats


def clustered_mean_se(values, clusters) -> tuple[float, float, int]:
    """Mean, its cluster-robust standard error and the number of clusters.

    Parameters
    ----------
    values : array-like ``[n]``
    clusters : array-like ``[n]``
        Cluster id of each value (the context video).

    Returns
    -------
    (mean, se, G); ``se`` is NaN with fewer than two clusters, everything NaN (G = 0) without values.
    """
    values = np.asarray(values, dtype=np.float64)
    n = len(values)
    if n == 0:
        return math.nan, math.nan, 0
    mean = float(values.mean())
    resid = pd.Series(values - mean).groupby(np.asarray(clusters)).sum().to_numpy()
    g = len(resid)
    if g < 2:
        return mean, math.nan, g
    return mean, math.sqrt(g / (g - 1) * float((resid**2).sum()) / n**2), g


def clustered_mean_ci(values, clusters, level: float = 0.95) -> tuple[float, float]:
    """Mean and half-width of its cluster-robust confidence interval (NaN with fewer than two clusters).

    Parameters
    ----------
    values : array-like ``[n]``
    clusters : array-like ``[n]``
        Cluster id of each value (the context video).
    """
    mean, se, g = clustered_mean_se(values, clusters)
    if g < 2:
        return mean, math.nan
    return mean, float(stats.t.ppf(0.5 + level / 2, g - 1) * se)


def clustered_t_test(differences, clusters) -> float:
    """Two-sided p-value of the cluster-robust paired t-test that the mean difference is 0.

    NaN with fewer than two clusters; 1 when every difference is 0, 0 when they all equal one
    non-zero value (no spread, a certain difference).
    """
    mean, se, g = clustered_mean_se(differences, clusters)
    if g < 2:
        return math.nan
    if se == 0:
        return 1.0 if mean == 0 else 0.0
    return float(2 * stats.t.sf(abs(mean / se), g - 1))


def seed_spread(scores, seeds) -> float:
    """The spread of a method over seeds: the sample standard deviation (``ddof = 1``) of its
    per-seed mean scores; NaN with fewer than two seeds."""
    means = pd.Series(np.asarray(scores, dtype=np.float64)).groupby(np.asarray(seeds)).mean()
    return float(means.std(ddof=1)) if len(means) > 1 else math.nan
