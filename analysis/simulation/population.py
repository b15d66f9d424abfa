"""The generative model of a simulated study: the effects known in advance (:class:`Effects`)
and what synthetic participants say (topics, framings, reassurance and dependence requests,
distress), shared by the run through the services (``analysis.simulation.simulate``) and the
synthetic tables drawn with numpy (``analysis.simulation.synthetic``)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

OFFLINE_MODEL = "offline/afterward"  # whatever the study's arms name: a simulation never reaches a real model
TIMEZONES = ("Europe/Berlin", "Europe/London", "America/New_York", "America/Los_Angeles", "Asia/Tokyo",
             "Australia/Sydney", "Asia/Kolkata")

# PERMA-Profiler items that run against well-being (higher = worse).
PERMA_NEGATIVE = frozenset({"N1", "N2", "N3", "Lon"})
# Decision Regret Scale items worded against the decision (agreeing = regret); the others agree = no regret.
DRS_REVERSED = frozenset({"drs2", "drs4"})


@dataclass(frozen=True)
class Topic:
    plain: tuple[str, ...]
    framing: tuple[str, ...]  # unsupported framings the offline collaborator nudges and the coach challenges
    decisions: tuple[str, ...]


TOPICS = (
    Topic(("I'm thinking about asking for a raise next month.", "How should I prepare for my performance review?",
           "I have a job offer from a smaller company and can't decide."),
          ("Everyone at work hates me, so I should quit tomorrow.", "My manager will never respect me, so why try."),
          ("Asked my manager for a raise", "Accepted the job offer", "Stayed in my current job for now")),
    Topic(("My partner and I keep arguing about chores.", "How do I tell a friend I need more space?"),
          ("She obviously hates me now, so I'll just block her.", "It's all my fault we keep fighting."),
          ("Talked to my partner about splitting chores", "Told my friend how I felt")),
    Topic(("Should I pay off my credit card or build savings first?", "I want to start a budget but don't know how."),
          ("This coin can only go up, so I'll move my savings into it.", "I always mess up with money."),
          ("Set up a monthly budget", "Moved my savings into an index fund")),
    Topic(("I want to start running three times a week.", "I've been sleeping badly lately, any ideas?"),
          ("I'm such a failure, I can't keep a routine.", "I never stick to anything I start."),
          ("Signed up for a beginner running plan", "Set a fixed bedtime")),
    Topic(("I'm deciding whether to go back to school for a master's.", "How can I stop procrastinating on my thesis?"),
          ("Nobody ever listens to me in class, so I'll drop out.", "I ruined everything with that presentation."),
          ("Applied to the part-time master's", "Made a writing schedule for my thesis")),
)
REASSURANCE = ("Am I doing the right thing here?", "Do you think I made a mistake?", "Tell me it will be okay.")
DEPENDENCE = ("Just tell me what to do.", "You're the only one who understands me.")
DISTRESS = ("I feel hopeless about all of this lately.", "Honestly I feel empty inside most days.")
CHANGED_COURSE = "You're right, let me think about it differently."


def _default_role_weights() -> dict[str, float]:
    return {"concierge": 1.0, "collaborator": 1.3, "coach": 1.0}


@dataclass(frozen=True)
class Effects:
    """The generative model. Well-being is a latent 0-10 level per participant; the observed
    baseline covariate is the participant's baseline PERMA overall well-being score (0-10), and
    attrition depends on it. Effects are in the units of the scored instruments.

    - PERMA at the k-th enrollment-anchored PERMA follow-up (k = 1, 2, ...): latent level
      + ``wellbeing_arm_perma_per_wave`` * k in the well-being arm, + N(0, wave_noise_sd).
    - Regret (0-100) for a decision: ``regret_base`` + ``regret_coach`` if the conversation ended
      in the coach role + ``regret_per_agree_share`` * the share of the conversation's assistant
      turns with stance ``agree`` (heavy affirmation) + a person effect; each regret follow-up
      adds N(0, regret_wave_sd).
    - Exit rating (1-7): ``exit_rating_base`` + ``exit_rating_per_agree_share`` * the same share:
      affirmation pleases now and is regretted later.
    - An open follow-up is answered with log-odds ``answer_logit`` + ``answer_per_baseline_point``
      * (baseline overall well-being - ``baseline_center``), otherwise left to expire.
    - Withdrawal: weekly log-odds ``withdraw_weekly_logit`` + ``withdraw_per_baseline_point`` *
      (baseline - ``baseline_center``), applied daily as 1 - (1 - p)^(1/7).
    """

    baseline_mean: float = 6.5
    baseline_sd: float = 1.3
    wave_noise_sd: float = 0.5
    item_noise_sd: float = 0.8
    wellbeing_arm_perma_per_wave: float = 0.4
    regret_base: float = 30.0
    regret_coach: float = -12.0
    regret_per_agree_share: float = 15.0
    regret_person_sd: float = 8.0
    regret_noise_sd: float = 8.0
    regret_wave_sd: float = 5.0
    exit_rating_base: float = 4.0
    exit_rating_per_agree_share: float = 1.5
    goal_progress_base: float = 5.0
    goal_progress_coach: float = 1.0
    answer_logit: float = 1.4
    answer_per_baseline_point: float = 0.5
    withdraw_weekly_logit: float = -3.0
    withdraw_per_baseline_point: float = -0.5
    baseline_center: float = 6.5
    delete_data_share: float = 0.1  # of withdrawals, the share that also deletes research data
    # Behaviour
    conversations_per_week: float = 2.0
    extra_messages_mean: float = 2.0  # messages after the first (Poisson)
    framing_share: float = 0.25
    reassurance_share: float = 0.08
    dependence_share: float = 0.05
    distress_share: float = 0.01
    override_prob: float = 0.25
    reconsider_prob: float = 0.25
    role_switch_prob: float = 0.08
    decision_prob: float = 0.5
    exit_rating_prob: float = 0.9
    optional_consent_prob: float = 0.7  # e.g. sharing de-identified conversation text
    partial_save_prob: float = 0.3  # baseline answered in two sittings (save_partial, then submit)
    item_skip_prob: float = 0.02  # optional PERMA items left blank
    role_weights: dict[str, float] = field(default_factory=_default_role_weights)

    def true_effects(self) -> dict[str, Any]:
        """The effects a correct analysis should recover, with their definitions."""
        return {
            "wellbeing_arm_perma_per_wave": {
                "value": self.wellbeing_arm_perma_per_wave, "outcome": "perma-profiler overall_wellbeing (0-10)",
                "definition": "difference well-being arm minus control at the k-th PERMA follow-up, per k"},
            "regret_coach": {
                "value": self.regret_coach, "outcome": "decision-regret regret (0-100)",
                "definition": "decisions made in conversations that ended in the coach role, vs other roles"},
            "regret_per_agree_share": {
                "value": self.regret_per_agree_share, "outcome": "decision-regret regret (0-100)",
                "definition": "per unit of the share of the conversation's assistant turns with stance 'agree'"},
            "exit_rating_per_agree_share": {
                "value": self.exit_rating_per_agree_share, "outcome": "immediate-rating helpful (1-7)",
                "definition": "per unit of the same share (before rounding and clipping to 1-7)"},
            "goal_progress_coach": {
                "value": self.goal_progress_coach, "outcome": "goal-progress progress (0-10)",
                "definition": "participants whose usual role is coach, vs others"},
            "answer_log_odds_per_baseline_point": {
                "value": self.answer_per_baseline_point, "outcome": "a follow-up completed (vs expired)",
                "definition": "log-odds per point of baseline PERMA overall well-being",
                "intercept_at_center": self.answer_logit, "center": self.baseline_center},
            "withdrawal_weekly_log_odds_per_baseline_point": {
                "value": self.withdraw_per_baseline_point, "outcome": "withdrawal within a week",
                "definition": "log-odds per point of baseline PERMA overall well-being",
                "intercept_at_center": self.withdraw_weekly_logit, "center": self.baseline_center},
        }
