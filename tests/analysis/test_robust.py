"""analysis.robust: CR2 cluster-robust standard errors with Bell-McCaffrey degrees of freedom."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
import statsmodels.api as sm

from analysis.robust import cluster_ols
from tests.analysis.robust_truth import direct_cr2


def clustered(seed: int, clusters: int, largest: int) -> tuple[pd.Series, pd.DataFrame, pd.Series]:
    rng = np.random.default_rng(seed)
    groups = np.repeat(np.arange(clusters), rng.integers(1, largest + 1, clusters))
    rng.shuffle(groups)
    n = len(groups)
    person = rng.normal(size=clusters)[groups]
    design = pd.DataFrame({"Intercept": 1.0, "x": rng.normal(size=n) + person,
                           "rare": (rng.random(clusters) < 0.15)[groups].astype(float)})
    y = pd.Series(1.0 + 0.5 * design["x"] + person + rng.normal(size=n))
    return y, design, pd.Series(groups).map(lambda g: f"P{g:03d}")


def test_with_one_observation_per_cluster_cr2_is_statsmodels_hc2() -> None:
    y, design, _ = clustered(1, 60, 1)
    fit = cluster_ols(y, design, pd.Series(np.arange(len(y))))
    direct = sm.OLS(y, design).fit(cov_type="HC2")
    np.testing.assert_allclose(fit.params, direct.params, rtol=1e-12)
    np.testing.assert_allclose(fit.bse, direct.bse, rtol=1e-10)


@pytest.mark.parametrize("seed", [2, 3])
def test_se_df_intervals_and_p_equal_the_textbook_computation(seed: int) -> None:
    y, design, groups = clustered(seed, 40, 6)
    fit = cluster_ols(y, design, groups)
    truth = direct_cr2(y, design, groups)
    np.testing.assert_allclose(fit.bse, truth["se"], rtol=1e-9)
    np.testing.assert_allclose(fit.df, truth["df"], rtol=1e-9)
    np.testing.assert_allclose(fit.conf_int()[0], truth["ci_low"], rtol=1e-9)
    np.testing.assert_allclose(fit.pvalues, truth["p"], rtol=1e-8)
    # A regressor that only a few clusters carry has far fewer degrees of freedom than clusters.
    assert fit.df["rare"] < 0.5 * fit.clusters
    # Degrees of freedom for the terms a caller tests only: the same figures for those, NaN for the
    # others, and the same covariance (a Wald test needs no degrees of freedom).
    some = cluster_ols(y, design, groups, df_for=["rare"])
    np.testing.assert_allclose(some.df["rare"], truth["df"]["rare"], rtol=1e-9)
    np.testing.assert_allclose(some.pvalues["rare"], truth["p"]["rare"], rtol=1e-8)
    assert some.df.drop("rare").isna().all()
    none = cluster_ols(y, design, groups, df_for=())
    assert none.df.isna().all()
    np.testing.assert_allclose(none.cov_params(), fit.cov_params(), rtol=1e-12)
    # CR2 is at least as wide as statsmodels' CR1 here (the small-sample correction it exists for).
    cr1 = sm.OLS(y, design).fit(cov_type="cluster", cov_kwds={"groups": pd.factorize(groups)[0]})
    assert fit.bse["rare"] >= cr1.bse["rare"] * 0.99


def test_a_cluster_fitted_exactly_gets_a_generalised_inverse_not_an_error() -> None:
    y, design, groups = clustered(4, 30, 4)
    design["only_first"] = (groups == groups.iloc[0]).astype(float)  # a dummy for one cluster
    fit = cluster_ols(y, design, groups)
    assert np.isfinite(fit.bse.drop("only_first")).all()


def test_a_column_not_estimable_is_left_out_with_a_sentence_not_a_warning() -> None:
    """A role nobody used (all zeros) and a copy of another column: both left out, in column order
    (the first of two equal columns kept), their estimates NaN; the others are the fit without them;
    no warning reaches the reader, the note says which columns and why."""
    import warnings

    from analysis.robust import not_identified_note

    y, design, groups = clustered(4, 40, 4)
    wider = design.assign(nobody=0.0, x_again=design["x"] * 2.0)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        fit = cluster_ols(y, wider, groups)
    assert fit.not_identified == ("nobody", "x_again")
    assert fit.params[["nobody", "x_again"]].isna().all()
    assert fit.bse[["nobody", "x_again"]].isna().all()
    plain = cluster_ols(y, design, groups)
    np.testing.assert_allclose(fit.params[design.columns], plain.params, rtol=1e-12)
    np.testing.assert_allclose(fit.bse[design.columns], plain.bse, rtol=1e-12)
    np.testing.assert_allclose(fit.df[design.columns], plain.df, rtol=1e-12)
    assert not_identified_note(plain) is None
    note = not_identified_note(fit)
    assert note is not None
    assert note.startswith("Not estimable on these data: nobody, x_again (constant, or a combination")
