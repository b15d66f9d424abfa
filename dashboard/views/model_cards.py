"""Model cards: how each prompt (a study role or a bare prompt) and model behaved in the latest
pre-deployment evaluation (``afterward eval``), its change since the previous version with a 95%
interval paired by query, and whether the runs behind the cards passed their release gates.

Every role sees this page, viewers too: an evaluation run writes no participant data, so there is
nothing to suppress and no read to audit (``dashboard.evaluations``). Where a card's previous
version was measured on other queries (or by another judge), the page says so and shows no change.
"""

from __future__ import annotations

import altair as alt
import streamlit as st

from dashboard import auth, evaluations, show


def render(context: auth.Context) -> None:
    st.title("Model cards")
    st.caption(f"{context.title} · your role: {context.role} · the pre-deployment evaluations of this database's "
               "prompts and models (the same for every study); no participant data")
    read = evaluations.evaluations(context.database_url, context.slug)
    show.refreshed(read)
    cards = read["cards"]
    if cards.empty:
        st.info("No model cards yet. They are written after an evaluation run: afterward eval cards --run RUN.")
        return
    st.markdown("Each measure is a share of the evaluation's queries with its 95% interval. The change since the "
                "previous version is the mean of the per-query differences over the queries both versions ran, "
                "with its 95% interval (Bonett-Price) and the exact sign test's p; an interval that contains 0 "
                "shows no clear change.")
    simulated = sorted(set(cards.loc[cards["simulated"], "model"]))
    if simulated:
        one = len(simulated) == 1
        st.warning(f"Simulated: {', '.join(simulated)} "
                   + ("is a scripted stand-in (evals/simulated.py), not a language model" if one else
                      "are scripted stand-ins (evals/simulated.py), not language models")
                   + ", written to behave like published findings on warm and validating assistants. Those cards "
                     "show what the evaluation finds, not how any real model behaves (the table's simulated column "
                     "marks them).")
    for note in read["notes"].to_dict("records"):
        st.warning(f"{note['condition']} × {note['model']}: no change shown: {note['note']}.")
    show.table(cards, "Latest model cards", file_name="model-cards",
               caption="One row per card (condition × model, its newest run) and measure: "
                       + "; ".join(f"{name}: {meaning}" for name, meaning in evaluations.METRIC_MEANINGS.items()))
    changed = cards.dropna(subset=["change"]).assign(card=lambda f: f["condition"] + " × " + f["model"])
    if not changed.empty:
        base = alt.Chart(changed).encode(y=alt.Y("metric:N", title=None), color=alt.Color("card:N", title="card"),
                                         yOffset="card:N")
        show.chart(
            base.mark_rule().encode(x=alt.X("change_low:Q", title="change since the previous version (95% interval)"),
                                    x2="change_high:Q")
            + base.mark_point(filled=True).encode(x="change:Q", tooltip=["card", "metric", "change", "change_low",
                                                                         "change_high", "paired_queries", "p",
                                                                         "since"]),
            caption="Change since the previous version of each card, paired by query, with its 95% interval")
    st.subheader("Release gates")
    runs = read["runs"]
    for run in runs.to_dict("records"):
        line = f"Run {run['run']} ({run['name']}): {run['verdict']}"
        if run["passed"]:
            st.success(line)
        elif str(run["verdict"]).startswith("gates FAILED"):
            st.error(line)
        else:
            st.info(line)
    gates = read["gates"]
    if not gates.empty:
        show.table(gates, "Gate results", file_name="gate-results",
                   caption="The grid's rules judged on each run behind these cards (afterward eval gate RUN): a rule "
                           "passes only when its whole 95% interval does; FAIL rows of rule 'the run' are cells not "
                           "done or a refused baseline comparison.")
    with st.expander("The cards as written (Markdown)"):
        for card in read["markdown"].to_dict("records"):
            st.markdown(str(card["markdown"]).replace("# Model card", "#### Model card", 1))  # under the page's title


render(auth.require())
