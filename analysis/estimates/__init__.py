"""The statistical models that link how conversations went to how people were doing weeks later.

Each model takes the read side's pandas frames (never a database): the participant x wave panel
(``analysis.panel.panel``), the conversation features (``analysis.features.conversation_features``)
and the survival table (``analysis.panel.survival``), held together by :class:`StudyData`. Each
returns a result object with tidy tables (one row per estimate, intervals beside it), the data
for plots (Kaplan-Meier curves, marginal means per wave, forest-plot rows) and, next to the
estimates, who is in the fit: participants, observations, missingness by wave and attrition.

    >>> from analysis.estimates import StudyData, perma_trajectories, regret_model
    >>> data = StudyData.load(engine, "wellbeing-pilot")
    >>> fit = perma_trajectories(data)
    >>> fit.fixed_effects                       # estimates with 95% intervals
    >>> fit.marginal_means                      # per wave and arm, for the trajectory plot
    >>> regret_model(data).coefficients

One module per model: ``perma`` (the mixed model of PERMA trajectories over the waves),
``regret`` (Decision Regret on the conversation's features), ``prediction`` (immediate vs
delayed: the exit rating against the features as predictors of the delayed outcomes),
``dropout`` (survival), ``subgroups`` and ``screen`` (the feature screen); ``common`` holds the
data, the sample and the helpers they share. A library: nothing is printed or written, and every
random step takes a seed.
"""

from analysis.estimates.common import OBSERVABLE, REGRET_FEATURES, Sample, StudyData
from analysis.estimates.dropout import DropoutSurvival, dropout_survival
from analysis.estimates.perma import PermaTrajectories, perma_trajectories
from analysis.estimates.prediction import (
    PERMA_CHANGE_FEATURES,
    ImmediateVsDelayed,
    immediate_vs_delayed,
    perma_change_outcomes,
)
from analysis.estimates.regret import RegretModel, decision_outcomes, regret_model
from analysis.estimates.screen import FeatureScreen, feature_screen
from analysis.estimates.subgroups import SubgroupEffects, subgroup_effects

__all__ = [
    "OBSERVABLE", "PERMA_CHANGE_FEATURES", "REGRET_FEATURES", "DropoutSurvival", "FeatureScreen",
    "ImmediateVsDelayed", "PermaTrajectories", "RegretModel", "Sample", "StudyData", "SubgroupEffects",
    "decision_outcomes", "dropout_survival", "feature_screen", "immediate_vs_delayed", "perma_change_outcomes",
    "perma_trajectories", "regret_model", "subgroup_effects",
]
