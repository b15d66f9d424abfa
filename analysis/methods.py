"""The report's methods paragraph, written from what was fitted rather than from what was meant to be:
each model's formula read off the design it was fitted with, the estimation method the
fit reports (REML), the degrees of freedom its intervals used, its random-effects structure and any
fallback the fit took (its notes), the participants and observations in it, the missing-data
handling (complete case, and the sensitivity analyses when they ran), the multiplicity rules (the
frozen plan's, the report's own) and the software that computed it.

    >>> methods_paragraphs(suite, plan)     # analysis.report.ModelSuite, analysis.plan_report.PlanRun
"""

from __future__ import annotations

import html
import platform
from typing import TYPE_CHECKING, Any

from analysis.estimates.mixed import RandomInterceptFit
from analysis.plan import MULTIPLICITY
from analysis.plan_report import PlanRun
from analysis.software import afterward_version, installed_versions

if TYPE_CHECKING:
    from analysis.report import ModelSuite

METHODS_TITLE = "Methods"
SOFTWARE = ("statsmodels", "numpy", "pandas", "scipy", "lifelines")


def term_name(term: str) -> str:
    """A design column in formula notation: ``wellbeing vs control x day`` -> ``arm[wellbeing]:day``."""
    if " vs " not in term:
        return term if " " not in term else f"`{term}`"
    group, _, rest = term.partition(" vs ")
    _, _, interaction = rest.partition(" x ")
    return f"arm[{group}]" + (f":{interaction}" if interaction else "")


def perma_formula(result: Any, outcome: str) -> str:
    """The fitted PERMA model in lme4's notation, e.g. ``overall_wellbeing ~ 1 + baseline + day +
    arm[wellbeing] + arm[wellbeing]:day + (1 | participant)`` (no random part for an OLS fit)."""
    names = [term_name(str(name)) for name in result.model.exog_names]
    fixed = " + ".join("1" if name == "Intercept" else name for name in names)
    if not hasattr(result, "cov_re"):
        return f"{outcome} ~ {fixed}"
    slopes = result.cov_re.shape[0] > 1
    return f"{outcome} ~ {fixed} + ({'1 + week' if slopes else '1'} | participant)"


def _sentence(text: str) -> str:
    return text[:1].upper() + text[1:]


def _perma(suite: ModelSuite) -> str:
    fit = suite.perma
    if fit is None:
        return f"The PERMA model was not estimated: {suite.not_estimated.get('perma', 'no fit')}."
    sentences = []
    for outcome, result in fit.fits.items():
        sample = fit.samples[outcome]
        fixed = fit.fixed_effects[fit.fixed_effects["outcome"] == outcome]
        df = float(fixed["df"].iloc[0])
        structure = str(fit.random_effects.loc[fit.random_effects["outcome"] == outcome, "structure"].iloc[0])
        means = fit.marginal_means[fit.marginal_means["outcome"] == outcome].drop_duplicates("wave")
        waves = ", ".join(f"{w} at day {d:.1f}" for w, d in zip(means["wave"], means["days"], strict=True))
        if hasattr(result, "cov_re"):
            how = "restricted maximum likelihood (REML)" if result.method == "REML" else "maximum likelihood (ML)"
            engine = ("from per-participant sums (analysis.estimates.mixed, equal to statsmodels' MixedLM)"
                      if isinstance(result, RandomInterceptFit) else "with statsmodels' MixedLM")
            method = f"fitted by {how} {engine}; random effects: {structure}"
        else:
            method = ("fitted by ordinary least squares (one observation per participant: no random effect is "
                      "identified)")
        fallback = [_sentence(note.removeprefix(f"{outcome}: ")) for note in fit.notes
                    if note.startswith(f"{outcome}: ")
                    and any(word in note.lower() for word in ("random slope", "fitted with", "boundary", "random-"))]
        sentences.append(
            f"PERMA {outcome.replace('_', ' ')} at the enrollment-anchored follow-ups ({waves}; time as days since "
            f"enrollment) was modelled as {perma_formula(result, outcome)}, {method}."
            + (" " + " ".join(fallback) if fallback else "")
            + f" The fit used {sample.observations:,} observations from {sample.participants:,} participants (of "
            f"{sample.eligible_observations:,} eligible observations from {sample.eligible_participants:,} "
            f"participants). Intervals and p-values: Student's t on {df:g} degrees of freedom (participants minus "
            "fixed effects, a cluster-count approximation; Satterthwaite and Kenward-Roger are not in statsmodels).")
    timed = [term_name(str(t)) for t in dict.fromkeys(fit.fixed_effects["term"]) if str(t).endswith(" x day")]
    return (f"Primary model (reference arm {fit.reference}"
            + (f"; the primary estimand is the arm x time term {timed[0]}, the change per day since enrollment in "
               "the arm difference" if timed else "") + "). " + " ".join(sentences))


def _missing(suite: ModelSuite) -> str:
    text = ("Missing data: the models are fitted to complete cases (a follow-up counts once its window has closed; "
            "unanswered ones are missing), valid if the outcomes are missing at random given the covariates (for the "
            "mixed model, given them and the participant's observed waves).")
    result = suite.sensitivity
    if result is None:
        reason = suite.unchecked.get("sensitivity")
        return text + (f" The sensitivity analyses were not computed: {reason}." if reason else "")
    deltas = result.tipping["delta"]
    point = result.tipping_point()
    return (text + f" Sensitivity analyses of the primary estimate ({result.outcome}): multiple imputation by chained "
            f"equations (statsmodels' MICEData, predictive mean matching, {result.imputations} imputed data sets, "
            "Rubin's rules with Barnard and Rubin's degrees of freedom), and a delta-adjusted tipping-point analysis "
            f"(imputed scores of {'the intervention arm(s)' if result.shift == 'intervention' else 'every arm'} "
            f"shifted by delta from {deltas.min():g} to {deltas.max():g} points in {deltas.nunique()} steps, the model "
            "refitted to each imputed data set): "
            + (f"the conclusion at the 95% level changes at delta of about {point:.2f} points." if point is not None
               else "the conclusion at the 95% level holds over the whole grid."))


def _others(suite: ModelSuite) -> list[str]:
    found = []
    if suite.regret is not None:
        terms = [term_name(str(t)) for t in suite.regret.coefficients["term"] if t != "Intercept"]
        sample = suite.regret.sample
        found.append(f"Decision regret (0-100): ordinary least squares, regret ~ 1 + {' + '.join(terms)}, every "
                     f"response a row ({sample.observations:,} from {sample.participants:,} participants), with "
                     "cluster-robust standard errors by participant (CR2) and Bell-McCaffrey degrees of freedom.")
    if suite.headline is not None and not suite.headline.table.empty:
        found.append(f"Immediate vs delayed: out-of-fold R² and AUC within arm, {suite.options.get('n_boot')} "
                     f"bootstrap replicates by participant (seed {suite.options.get('seed')}) for the intervals.")
    if suite.screen is not None:
        found.append(f"Feature screen: one OLS per feature within arm, CR2 by participant, Benjamini-Hochberg over "
                     f"the features of each outcome at {suite.screen.alpha:g}.")
    if suite.dropout is not None:
        found.append(f"Dropout: Kaplan-Meier and Aalen-Johansen estimates, log-rank tests and a cause-specific Cox "
                     f"model (Efron ties; {suite.dropout.sample.participants:,} participants) with R's cox.zph "
                     "proportional-hazards test (lifelines).")
    if suite.subgroups is not None:
        found.append("Subgroups: the arm x time and focal-role effects within each level by OLS with CR2 errors, an "
                     "interaction test per subgroup variable, Holm's rule over those tests at "
                     f"{suite.subgroups.alpha:g}.")
    return found


def _multiplicity(suite: ModelSuite, plan: PlanRun | None) -> str:
    frozen = plan.frozen if plan is not None else None
    text = ("Multiplicity: no analysis plan was frozen, so every estimate is exploratory and none is adjusted for the "
            "others" if frozen is None else
            f"Multiplicity: the frozen plan's primary analysis is tested alone at alpha {frozen.plan.alpha:g}; over "
            f"its secondary analyses, {MULTIPLICITY[frozen.plan.multiplicity]}")
    rules = (("Benjamini-Hochberg over the feature screen's features", suite.screen),
             ("Holm over the subgroup interaction tests", suite.subgroups))
    own = [rule for rule, fitted in rules if fitted is not None]
    return text + ("; within the report, " + " and ".join(own) if own else "") + "; nothing else is adjusted."


def _diagnostics(suite: ModelSuite) -> str:
    if not suite.diagnostics:
        return ""
    parts = [f"{'PERMA ' + d.outcome if d.model == 'perma' else 'decision regret'}: "
             f"{int(d.influence['influential'].sum())} of {len(d.influence)} participants over {d.threshold:.3f}"
             for d in suite.diagnostics]
    return ("Diagnostics: residuals against fitted values and normal QQ plots, the predicted random effects, and "
            "leave-one-participant-out influence on the primary coefficient (DFBETAS, cut-off 2/sqrt(participants); "
            + "; ".join(parts) + ").")


def software(version: str | None = None) -> str:
    versions = installed_versions(SOFTWARE)
    return (f"Software: afterward {version or afterward_version()}, Python {platform.python_version()}, "
            + ", ".join(f"{name} {v}" for name, v in versions.items()) + ".")


def methods_paragraphs(suite: ModelSuite, plan: PlanRun | None = None, version: str | None = None) -> list[str]:
    """The methods section's paragraphs, in the order a reader wants them."""
    return [p for p in (_perma(suite), " ".join(_others(suite)), _missing(suite), _multiplicity(suite, plan),
                        _diagnostics(suite), software(version)) if p]


def methods_section(suite: ModelSuite, plan: PlanRun | None = None, version: str | None = None) -> str:
    body = "".join(f"<p>{html.escape(p)}</p>" for p in methods_paragraphs(suite, plan, version))
    return (f'<section id="methods" aria-labelledby="methods-title"><h2 id="methods-title">{METHODS_TITLE}</h2>'
            f'<div id="methods-text">{body}</div></section>')
