"""CR2 standard errors and Bell-McCaffrey degrees of freedom the textbook way (n x n matrices,
one cluster at a time), as the truth ``analysis.robust`` is checked against."""

from __future__ import annotations

import numpy as np
import pandas as pd
import statsmodels.api as sm
from scipy import stats


def direct_cr2(y: pd.Series, design: pd.DataFrame, clusters: pd.Series) -> pd.DataFrame:
    """Per coefficient: estimate, se, df, ci_low, ci_high, p (t with the BM degrees of freedom)."""
    x = design.to_numpy(float)
    ols = sm.OLS(y.to_numpy(float), x).fit()
    bread = np.linalg.inv(x.T @ x)
    residual_maker = np.eye(len(x)) - x @ bread @ x.T
    groups = pd.factorize(clusters)[0]
    meat = np.zeros((x.shape[1], x.shape[1]))
    columns: list[list[np.ndarray]] = [[] for _ in range(x.shape[1])]
    for g in np.unique(groups):
        rows = np.flatnonzero(groups == g)
        values, vectors = np.linalg.eigh(residual_maker[np.ix_(rows, rows)])
        adjust = vectors @ np.diag(values ** -0.5) @ vectors.T
        score = x[rows].T @ adjust @ ols.resid[rows]
        meat += np.outer(score, score)
        for j in range(x.shape[1]):
            columns[j].append(residual_maker[:, rows] @ adjust @ x[rows] @ bread[:, j])
    covariance = bread @ meat @ bread
    se = np.sqrt(np.diag(covariance))
    df = []
    for j in range(x.shape[1]):
        g_matrix = np.column_stack(columns[j])
        eigen = np.linalg.eigvalsh(g_matrix.T @ g_matrix)
        df.append(eigen.sum() ** 2 / (eigen**2).sum())
    half = stats.t.ppf(0.975, df) * se
    return pd.DataFrame({"estimate": ols.params, "se": se, "df": df, "ci_low": ols.params - half,
                         "ci_high": ols.params + half, "p": 2 * stats.t.sf(np.abs(ols.params / se), df)},
                        index=design.columns)
