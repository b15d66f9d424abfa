"""``analysis.power`` and ``afterward power``: power by simulation against closed forms.

Simulated powers are compared with the closed form within Z binomial standard errors of the
replicates; estimates with the truth within Z standard errors of their mean over replicates.
"""

from __future__ import annotations

import dataclasses
import math
from pathlib import Path

import numpy as np
import pytest
from typer.testing import CliRunner

from analysis.power import (
    closed_form_n_per_arm,
    closed_form_power,
    fit_perma_arm,
    sample_sizes,
    simulate_power,
    with_attrition,
)
from analysis.simulation.population import Effects
from analysis.simulation.synthetic import synthetic_study
from api.cli import app

Z = 4.0
runner = CliRunner()


def binomial_se(p: float, replicates: int) -> float:
    return math.sqrt(p * (1 - p) / replicates)


def test_the_closed_form_is_the_textbook_one() -> None:
    # 2 (z_0.975 + z_0.8)^2 / d^2 with the tabled quantiles: 63 per arm for half an SD.
    by_hand = 2 * (1.959963985 + 0.841621234) ** 2 * 1.0**2 / 0.5**2
    assert closed_form_n_per_arm(0.5, 1.0, 0.05, 0.8) == pytest.approx(by_hand, rel=1e-8)
    assert math.ceil(by_hand) == 63
    assert closed_form_power(by_hand, 0.5, 1.0, 0.05) == pytest.approx(0.8, abs=1e-6)
    assert closed_form_n_per_arm(-2.0, 10.0) == closed_form_n_per_arm(2.0, 10.0)  # only the size of the effect


def test_simulated_two_arm_power_reproduces_the_closed_form() -> None:
    """Zero attrition: at every n the simulated power is the closed form's, and the closed-form
    sample size lies where the simulated curve crosses the target (within simulation error)."""
    replicates = 2000
    needed = 2 * closed_form_n_per_arm(0.5, 1.0)  # 125.6 participants in all
    curve = simulate_power("two-means", 0.5, sd=1.0, sizes=[64, 110, 118, 126, 134, 142, 200],
                           replicates=replicates, seed=7)
    for point in curve.points:
        expected = closed_form_power(point.n / 2, 0.5, 1.0)
        assert abs(point.power - expected) < Z * binomial_se(expected, replicates), point
        assert point.ci_low < point.power < point.ci_high
        assert abs(point.mean_estimate - 0.5) < Z * point.sd_estimate / math.sqrt(replicates)
    below = max(p.n for p in curve.points if p.ci_high < 0.8)
    above = min(p.n for p in curve.points if p.ci_low > 0.8)
    assert below < needed < above
    assert curve.n_reaching is not None
    assert below < curve.n_reaching <= above
    assert curve.closed_form_n == pytest.approx(needed)


def test_two_arm_attrition_inflates_the_sample_size_by_one_over_the_share_kept() -> None:
    replicates = 2000
    curve = simulate_power("two-means", 0.5, sd=1.0, attrition=0.3, sizes=[180], replicates=replicates, seed=3)
    assert curve.closed_form_n == pytest.approx(2 * closed_form_n_per_arm(0.5, 1.0) / 0.7)
    point = curve.points[0]
    assert point.mean_rows == pytest.approx(180 * 0.7, rel=0.02)
    expected = closed_form_power(180 * 0.7 / 2, 0.5, 1.0)
    assert abs(point.power - expected) < Z * binomial_se(expected, replicates)


def ancova_sd(e: Effects, items: int = 16) -> float:
    """The residual SD of a PERMA follow-up on the baseline, from the Effects by hand: both are the
    latent level plus the mean of the answered items' noise; the follow-up adds the wave noise."""
    keep = 1 - e.item_skip_prob
    weights = [math.comb(items, m) * keep**m * (1 - keep) ** (items - m) for m in range(1, items + 1)]
    measurement = e.item_noise_sd**2 * sum(w / m for m, w in zip(range(1, items + 1), weights, strict=True)) / sum(
        weights)
    level = e.baseline_sd**2
    return math.sqrt(level + e.wave_noise_sd**2 + measurement - level**2 / (level + measurement))


def test_perma_power_without_attrition_is_the_closed_form_with_the_ancova_sd() -> None:
    replicates, n, effect = 200, 100, 0.3
    curve = simulate_power("perma-arm", effect, attrition=0.0, sizes=[n], replicates=replicates, seed=5)
    point = curve.points[0]
    assert curve.wave == "perma-week-4"
    assert point.mean_rows == n  # everyone answered the last wave
    sd = ancova_sd(Effects())
    standard_error = sd * math.sqrt(2 / (n / 2))
    assert abs(point.mean_estimate - effect) < Z * standard_error / math.sqrt(replicates)
    assert abs(point.sd_estimate / standard_error - 1) < Z / math.sqrt(2 * replicates)
    expected = closed_form_power(n / 2, effect, sd)
    assert abs(point.power - expected) < Z * binomial_se(expected, replicates)


def test_perma_effect_at_an_earlier_wave_is_per_wave() -> None:
    study = synthetic_study(2000, seed=1, chat=False, effects=dataclasses.replace(
        with_attrition(Effects(), 0.0), wellbeing_arm_perma_per_wave=0.25))
    first, _, _ = fit_perma_arm(study, "perma-week-1")
    last, _, rows = fit_perma_arm(study, "perma-week-4")
    se = ancova_sd(Effects()) * math.sqrt(2 / 1000)
    assert abs(first - 0.25) < Z * se
    assert abs(last - 0.5) < Z * se
    assert rows == 2000
    curve = simulate_power("perma-arm", 0.4, wave="perma-week-1", attrition=0.0, sizes=[40], replicates=3)
    assert curve.wave == "perma-week-1"


def test_regret_power_grows_with_n_and_estimates_the_effect() -> None:
    replicates = 20
    curve = simulate_power("regret-role", -6.0, sizes=[40, 400], replicates=replicates, seed=2)
    small, large = curve.points
    assert large.ci_low > small.ci_high
    assert abs(large.mean_estimate - -6.0) < Z * large.sd_estimate / math.sqrt(replicates)
    assert large.mean_rows > 5 * small.mean_rows  # answered regret waves grow with n


def test_attrition_as_a_number_replaces_the_effects_answering_and_withdrawal() -> None:
    everyone = synthetic_study(300, seed=4, chat=False, effects=with_attrition(Effects(), 0.0))
    assert (everyone.waves["response_status"] == "completed").all()
    assert everyone.people["withdrawn_at"].isna().all()
    some = synthetic_study(3000, seed=4, chat=False, effects=with_attrition(Effects(), 0.3))
    completed = (some.waves["response_status"] == "completed").to_numpy()
    assert abs(completed.mean() - 0.7) < Z * binomial_se(0.7, len(completed))
    with pytest.raises(ValueError, match="attrition"):
        with_attrition(Effects(), 1.0)


def test_the_same_seed_gives_the_same_curve_and_points_do_not_depend_on_the_grid() -> None:
    one = simulate_power("two-means", 0.4, sizes=[50, 100], replicates=300, seed=11)
    two = simulate_power("two-means", 0.4, sizes=[50, 100], replicates=300, seed=11)
    wider = simulate_power("two-means", 0.4, sizes=[50, 76, 100], replicates=300, seed=11)
    assert one.table.equals(two.table)
    assert wider.table[wider.table["n"] != 76].reset_index(drop=True).equals(one.table)
    other = simulate_power("two-means", 0.4, sizes=[50, 100], replicates=300, seed=12)
    assert not np.array_equal(other.table["mean_estimate"], one.table["mean_estimate"])


def test_bad_arguments_are_refused() -> None:
    for kwargs, message in (({"kind": "bogus"}, "unknown kind"), ({"alpha": 1.5}, "alpha"),
                            ({"sizes": [2]}, "at least 4"), ({"attrition": 1.2}, "attrition"),
                            ({"seed": -1}, "seed"),
                            ({"wave": "regret-day-3", "kind": "perma-arm"}, "not a PERMA follow-up")):
        arguments = {"kind": "two-means", "effect": 0.5, "sizes": [50], "replicates": 2, **kwargs}
        with pytest.raises(ValueError, match=message):
            simulate_power(**arguments)  # type: ignore[arg-type]
    assert sample_sizes(50, 500, 4) == [50, 200, 350, 500]
    assert sample_sizes(51, 51, 3) == [52]


# The command


def test_the_command_prints_the_curve_the_plot_and_the_closed_form() -> None:
    result = runner.invoke(app, ["power", "--kind", "two-means", "--effect", "0.5", "--sd", "1", "--min-n", "100",
                                 "--max-n", "160", "--steps", "4", "--replicates", "400", "--seed", "3"])
    assert result.exit_code == 0, result.output
    lines = result.output.splitlines()
    rows = [line.split() for line in lines if line.strip() and line.split()[0] in {"100", "120", "140", "160"}]
    table, plot = rows[:4], rows[4:]
    assert [int(r[0]) for r in table] == [100, 120, 140, 160]
    powers = [float(r[1]) for r in table]
    for n, power in zip((100, 120, 140, 160), powers, strict=True):
        expected = closed_form_power(n / 2, 0.5, 1.0)
        assert abs(power - expected) < Z * binomial_se(expected, 400)
    assert len(plot) == 4
    assert all("|" in r[1] for r in plot)
    assert f"closed form (two arms, normal approximation): n = {math.ceil(2 * closed_form_n_per_arm(0.5, 1))}" \
        in result.output
    assert "n reaching power 0.8 (the smallest of the grid):" in result.output


def test_the_command_refuses_bad_input_in_one_line(tmp_path: Path, example_protocol: str) -> None:
    broken = tmp_path / "protocol.yaml"
    broken.write_text(example_protocol.replace("offset: P7D", "offset: soon"))
    for arguments, message in (
        (["--kind", "bogus"], "unknown --kind 'bogus'"),
        (["--alpha", "1.5"], "--alpha must be between 0 and 1"),
        (["--min-n", "500", "--max-n", "100"], "--min-n <= --max-n"),
        (["--effect", "0"], "--effect must be a non-zero number"),
        (["--seed", "-3"], "--seed must not be negative"),
        (["--kind", "perma-arm", "--effect", "0.3", "--wave", "regret-day-3"], "not a PERMA follow-up"),
        (["--protocol", str(tmp_path / "missing.yaml")], "no protocol file"),
        (["--protocol", str(broken)], "followups[0].offset (line"),
    ):
        result = runner.invoke(app, ["power", "--replicates", "2", "--steps", "1", *arguments])
        assert result.exit_code == 1, (arguments, result.output)
        assert message in result.output, (arguments, result.output)
        assert len(result.output.strip().splitlines()) == 1, result.output
