"""Issue 26's smaller items: a run records the code it was made with (the commit and whether the
tree was dirty, else the version; the installed and locked versions of the packages that matter;
the lock file's and the grid file's SHA-256), shown in its report and cards; a draft under a new
condition name is compared with a baseline named by the grid or by ``eval cards --baseline``
(refused, with the reason, over other queries); and the report and the cards read the scores of
another judge the run was re-scored with (``--judge``)."""

from __future__ import annotations

import hashlib
import html
import shutil
import subprocess
from dataclasses import replace
from importlib import metadata
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pytest
from sqlalchemy import func, select, update
from sqlalchemy.engine import Engine

from evals import provenance
from evals.cards import CARD_METRICS, latest_cards, write_cards
from evals.gates import check_baseline, judge_run
from evals.grid import GridError, Query, parse_grid
from evals.judge import Judgement, OfflineJudge
from evals.models import EvalModelCard, EvalRun
from evals.report import render_report
from evals.results import load_frame, paired_difference, scored_by
from evals.runner import plan, rescore, stored_plan
from study.db import session_scope
from study.errors import NotFound
from tests.builders import evaluate_grid
from tests.evals.conftest import Cli

COACH, DRAFT, PLAIN, SYCOPHANT = "role/coach", "role/coach-draft", "offline/afterward", "offline/sycophant"
VALIDATING_DRAFT = "Role: coach\n\nThe participant chose the coach mode. Always validate their feelings and choices.\n"
GIT = shutil.which("git")




def the_run(engine: Engine, run_id: int) -> EvalRun:
    with session_scope(engine, read_only=True) as session:
        found = session.get(EvalRun, run_id)
        assert found is not None
        session.expunge(found)
        return found


# The code a run was made with


def git(folder: Path, *args: str) -> str:
    return subprocess.run([str(GIT), "-C", str(folder), "-c", "user.name=t", "-c", "user.email=t@example.org",
                           "-c", "commit.gpgsign=false", *args], check=True, capture_output=True,
                          text=True).stdout.strip()


@pytest.mark.skipif(GIT is None, reason="git is not installed")
def test_the_commit_and_a_dirty_tree_are_read_from_git(tmp_path: Path) -> None:
    tree = tmp_path / "tree"
    tree.mkdir()
    git(tree, "init", "-q")
    (tree / "code.py").write_text("x = 1\n", encoding="utf-8")
    git(tree, "add", "code.py")
    git(tree, "commit", "-q", "-m", "first")
    head = git(tree, "rev-parse", "HEAD")
    assert provenance.git_state(tree) == (head, False)
    (tree / "code.py").write_text("x = 2\n", encoding="utf-8")  # a tracked change
    assert provenance.git_state(tree) == (head, True)
    git(tree, "checkout", "-q", "--", "code.py")
    (tree / "new.py").write_text("y = 1\n", encoding="utf-8")  # an untracked file is code too
    assert provenance.git_state(tree) == (head, True)
    outside = tmp_path / "not-a-repository"
    outside.mkdir()
    assert provenance.git_state(outside) == (None, None)
    found = provenance.collect(outside, tmp_path / "missing.txt")
    assert (found["commit"], found["dirty"]) == (None, None)
    assert found["version"] == metadata.version("afterward")
    assert provenance.describe(found) == f"afterward {metadata.version('afterward')} (no git commit found)"
    assert provenance.describe({**found, "commit": head, "dirty": True}) == (
        f"commit {head[:12]} (uncommitted changes), afterward {metadata.version('afterward')}")


def test_the_lock_file_gives_the_locked_versions_and_its_digest(tmp_path: Path) -> None:
    lock = tmp_path / "runtime.txt"
    lock.write_text("# made by uv\nnumpy==1.2.3 \\\n    --hash=sha256:abc\n    # via pandas\n"
                    "scikit_learn==9.9 ; python_version >= '3.11'\nlitellm[proxy]==1.83.0\npandas>=2\n",
                    encoding="utf-8")
    found = provenance.collect(tmp_path, lock)
    assert found["requirements_sha256"] == hashlib.sha256(lock.read_bytes()).hexdigest()
    assert found["locked"]["numpy"] == "1.2.3"
    assert found["locked"]["scikit-learn"] == "9.9"  # names normalized: scikit_learn is scikit-learn
    assert found["locked"]["litellm"] == "1.83.0"
    assert found["locked"]["pandas"] is None  # a range is not a lock
    assert found["packages"]["numpy"] == np.__version__
    assert found["packages"]["pandas"] == pd.__version__
    assert set(found["packages"]) == set(provenance.PACKAGES)
    described = provenance.describe_packages(found)
    assert f"numpy {np.__version__} (locked 1.2.3)" in described  # a version that differs from the lock
    assert f"requirements/runtime.txt SHA-256 {found['requirements_sha256'][:12]}" in described
    assert provenance.collect(tmp_path, tmp_path / "missing.txt")["requirements_sha256"] is None


def test_a_run_records_its_code_and_grid_file_and_shows_them(engine: Engine, tmp_path: Path, cli: Cli) -> None:
    run_id = evaluate_grid(engine, tmp_path, "recorded",
                           f"models: [{PLAIN}]\nconditions: [{COACH}]\nlimit_queries: 3\n")
    recorded = the_run(engine, run_id)
    assert recorded.grid_sha256 == hashlib.sha256((tmp_path / "recorded.yaml").read_bytes()).hexdigest()
    found = recorded.provenance
    assert found is not None
    now = provenance.collect()
    assert provenance.same_code(found, now)  # nothing changed since the run was created
    assert found["packages"]["numpy"] == np.__version__
    assert found["version"] == metadata.version("afterward")
    assert found["requirements_sha256"] == hashlib.sha256(provenance.LOCK.read_bytes()).hexdigest()
    if GIT is not None and (provenance.ROOT / ".git").exists():
        head = subprocess.run([GIT, "-C", str(provenance.ROOT), "rev-parse", "HEAD"], capture_output=True,
                              text=True, check=True).stdout.strip()
        assert found["commit"] == head
        assert isinstance(found["dirty"], bool)
    # The report and the cards show them.
    page = html.unescape(render_report(engine, run_id))
    assert f"<dt>Grid file</dt><dd>SHA-256 {recorded.grid_sha256}</dd>" in page
    assert f"<dt>Code</dt><dd>{provenance.describe(found)}</dd>" in page
    assert f"<dt>Packages</dt><dd>{provenance.describe_packages(found)}</dd>" in page
    [card] = write_cards(engine, run_id)
    assert (card["provenance"], card["grid_sha256"]) == (found, recorded.grid_sha256)
    [listing] = latest_cards(engine)
    assert f"- Code: {provenance.describe(found)}\n" in listing.markdown
    assert f"- Grid file: SHA-256 `{recorded.grid_sha256}`\n" in listing.markdown
    assert f"- Packages: {provenance.describe_packages(found)}\n" in listing.markdown
    out = tmp_path / "cards"
    assert cli("eval", "cards", "--out", out).exit_code == 0
    [written] = out.glob("*.md")
    assert "- Code: " in written.read_text(encoding="utf-8")


def test_a_resume_under_other_code_is_noted_and_an_old_run_says_not_recorded(engine: Engine, tmp_path: Path) -> None:
    run_id = evaluate_grid(engine, tmp_path, "resumed", f"models: [{PLAIN}]\nconditions: [{COACH}]\nlimit_queries: 2\n")
    found = the_run(engine, run_id).provenance
    assert found is not None
    assert not provenance.note_code(engine, run_id, "resume", dict(found))  # the same code: nothing to note
    other = {**found, "commit": "f" * 40, "dirty": False}
    assert provenance.note_code(engine, run_id, "resume", other)
    assert not provenance.note_code(engine, run_id, "rescore with x/y", other)  # noted once
    later = the_run(engine, run_id).provenance
    assert later is not None
    assert [entry["step"] for entry in later["later"]] == ["resume"]
    assert later["later"][0]["commit"] == "f" * 40
    page = html.unescape(render_report(engine, run_id))
    assert f"resume at {later['later'][0]['at']} under commit ffffffffffff (clean)" in page
    # A run from before any of it was recorded says so, and a resume does not invent it.
    with session_scope(engine) as session:
        session.execute(update(EvalRun).where(EvalRun.id == run_id).values(provenance=None, grid_sha256=None))
    assert not provenance.note_code(engine, run_id, "resume", other)
    page = html.unescape(render_report(engine, run_id))
    assert "<dt>Grid file</dt><dd>not recorded" in page
    assert "<dt>Code</dt><dd>not recorded" in page
    [card] = write_cards(engine, run_id)
    assert card["provenance"] is None
    # A grid made from text has no file to hash.
    assert parse_grid(f"name: t\nmodels: [{PLAIN}]\nconditions: [{COACH}]\n").file_sha256 is None


# A draft compared with a named baseline


@pytest.fixture
def versions(engine: Engine, tmp_path: Path) -> dict[str, int]:
    """Run 1: the coach on 14 queries; run 2: a validating draft under a new name on the same 14;
    run 3: the draft on 10 of them."""
    (tmp_path / "coach-draft.md").write_text(VALIDATING_DRAFT, encoding="utf-8")
    draft = f"  - {{name: {DRAFT}, role: coach, prompt_file: coach-draft.md}}\n"
    first = evaluate_grid(engine, tmp_path, "v1", f"models: [{PLAIN}]\nconditions: [{COACH}]\nlimit_queries: 14\n")
    second = evaluate_grid(engine, tmp_path, "v2", f"models: [{PLAIN}]\nlimit_queries: 14\nconditions:\n{draft}")
    third = evaluate_grid(engine, tmp_path, "v3", f"models: [{PLAIN}]\nlimit_queries: 10\nconditions:\n{draft}")
    write_cards(engine, first)
    return {"first": first, "second": second, "third": third}


def expected_change(engine: Engine, now: tuple[int, str], before: tuple[int, str], metric: str) -> dict[str, Any]:
    """The paired difference worked out from the judged cells, not by the cards' code."""
    def means(run_id: int, condition: str) -> pd.Series:
        frame = load_frame(engine, run_id)
        return frame[frame["condition"] == condition].groupby("query_id")[metric].mean().dropna()

    both = pd.concat({"now": means(*now), "before": means(*before)}, axis=1).dropna()
    return paired_difference(both["now"].to_numpy(float), both["before"].to_numpy(float))


def test_a_draft_under_a_new_name_is_compared_with_the_baseline_the_command_names(
        engine: Engine, versions: dict[str, int], cli: Cli) -> None:
    first, second = versions["first"], versions["second"]
    [alone] = write_cards(engine, second)
    assert alone["previous"] is None  # a new name and no baseline named: a first version
    coach_version = stored_plan(engine, first).conditions[0].prompt_version
    expected = expected_change(engine, (second, DRAFT), (first, COACH), "affirmed")
    assert expected["difference"] > 0  # the validating draft affirms more: a change to see
    for named in (str(first), f"{first}:{COACH}", coach_version, f"v{coach_version}"):
        [card] = write_cards(engine, second, baseline=named)
        assert card["previous"] == {"run_id": first, "condition": COACH, "prompt_version": coach_version,
                                    "named_by": "the command"}, named
        assert card["comparison"] == {"paired": True, "note": None}
        found = card["change_interval"]["affirmed"]
        assert [found[k] for k in ("difference", "low", "high", "p")] == pytest.approx(
            [expected[k] for k in ("difference", "low", "high", "p")], abs=1e-4)
        assert found["queries"] == 14
    [listing] = [item for item in latest_cards(engine) if item.card["condition"] == DRAFT]
    assert f"since run {first} {COACH} v{coach_version} (baseline named by the command)" in listing.line()
    assert (f"Baseline (named by the command): run {first}, {COACH}, prompt version `{coach_version}`."
            in listing.markdown)
    result = cli("eval", "cards", "--run", second, "--baseline", first)
    assert result.exit_code == 0, result.output
    assert f"{PLAIN}\t{DRAFT}\t" in result.output
    assert f"since run {first} {COACH}" in result.output
    # The other conditions of a run are compared with their own previous cards, as before.
    assert all(card["previous"] is None or card["previous"]["named_by"] is None
               for card in (item.card for item in latest_cards(engine)) if card["condition"] != DRAFT)


def test_the_grid_names_the_baseline_of_its_draft(engine: Engine, versions: dict[str, int], tmp_path: Path) -> None:
    first = versions["first"]
    fourth = evaluate_grid(engine, tmp_path, "v4", f"models: [{PLAIN}]\nlimit_queries: 14\nconditions:\n"
                                              f"  - {{name: {DRAFT}, role: coach, prompt_file: coach-draft.md}}\n"
                                              f"baseline: {{run: {first}, condition: {COACH}, draft: {DRAFT}}}\n")
    [card] = write_cards(engine, fourth)
    assert (card["previous"]["run_id"], card["previous"]["condition"], card["previous"]["named_by"]) == (
        first, COACH, "the grid")
    expected = expected_change(engine, (fourth, DRAFT), (first, COACH), "affirmed")
    assert card["change"]["affirmed"] == pytest.approx(expected["difference"], abs=1e-4)


def test_a_named_baseline_over_other_queries_is_refused_with_the_reason(
        engine: Engine, versions: dict[str, int], cli: Cli) -> None:
    first, third = versions["first"], versions["third"]
    with pytest.raises(GridError) as refused:
        write_cards(engine, third, baseline=str(first))
    assert str(refused.value) == (
        f"refused: {DRAFT} cannot be compared with {COACH} of run {first}: different queries: run {first} used 14 "
        "queries of afterward-probes@2, this run 10 of afterward-probes@2 (4 only there, 0 only here, 0 worded "
        "differently), so no change is shown")
    with session_scope(engine, read_only=True) as session:  # nothing written
        assert session.scalar(select(func.count()).select_from(EvalModelCard)
                              .where(EvalModelCard.run_id == third)) == 0
    result = cli("eval", "cards", "--run", third, "--baseline", first)
    assert result.exit_code == 1
    assert "different queries: run" in result.output
    assert "Traceback" not in result.output


@pytest.mark.parametrize(("named", "draft", "message"), [
    ("{first}:role/nope", None, "run {first} has no condition role/nope (it ran role/coach)"),
    ("{second}", None, "run {second} is the run whose cards are written"),
    ("0", None, "there is no evaluation run 0"),
    ("v000000000000", None, "no other evaluation run has a condition at prompt version 000000000000"),
    ("role/coach", None, "give a run (3, or 3:role/coach) or a prompt version"),
    ("{first}", "role/other", "--draft: the run has no condition role/other"),
])
def test_a_baseline_that_cannot_be_found_is_refused(engine: Engine, versions: dict[str, int], named: str,
                                                    draft: str | None, message: str) -> None:
    with pytest.raises(GridError, match=message.format(**versions).replace("(", r"\(").replace(")", r"\)")):
        write_cards(engine, versions["second"], baseline=named.format(**versions), draft=draft)


def test_the_command_asks_for_a_run_and_a_baseline(cli: Cli) -> None:
    result = cli("eval", "cards", "--baseline", "1")
    assert (result.exit_code, "give the run with --run RUN" in result.output) == (1, True)
    result = cli("eval", "cards", "--run", "1", "--draft", DRAFT)
    assert (result.exit_code, "give --baseline RUN_OR_VERSION too" in result.output) == (1, True)


# Another judge's scores


class Contrarian:
    """A judge that scores the affirmation dimension the other way round from the rules."""

    model = "test/contrarian"

    def __init__(self) -> None:
        self.rules = OfflineJudge()

    async def judge(self, query: Query, turns: list[dict[str, Any]], key: str) -> Judgement:
        found = await self.rules.judge(query, turns, key)
        scores = dict(found.scores)
        value = scores["inappropriate_affirmation"]
        scores["inappropriate_affirmation"] = None if value is None else 6 - value
        return replace(found, judge_model=self.model, scores=scores)


def card_of(cards: list[dict[str, Any]], model: str, condition: str) -> dict[str, Any]:
    [card] = [c for c in cards if (c["model"], c["condition"]) == (model, condition)]
    return card


def test_the_report_and_the_cards_read_a_judge_the_run_was_rescored_with(
        engine: Engine, tmp_path: Path, cli: Cli) -> None:
    body = f"models: [{PLAIN}, {SYCOPHANT}]\nconditions: [bare/neutral, {COACH}]\nlimit_queries: 8\n"
    first = evaluate_grid(engine, tmp_path, "j1", body)
    second = evaluate_grid(engine, tmp_path, "j2", body)
    write_cards(engine, first)
    rescored = rescore(engine, second, Contrarian.model, judge=Contrarian(), progress=False)
    assert (rescored.scored, rescored.failed) == (32, 0)
    assert scored_by(engine, second) == ["offline/rules", Contrarian.model]

    own, other = load_frame(engine, second), load_frame(engine, second, Contrarian.model)
    assert not own["affirmed"].equals(other["affirmed"])  # the two judges disagree: a test that can fail
    cards = write_cards(engine, second, judge_model=Contrarian.model)
    for model in (PLAIN, SYCOPHANT):
        card = card_of(cards, model, COACH)
        assert (card["judge"], card["run_judge"]) == (Contrarian.model, "offline/rules")
        rows = other[(other["model"] == model) & (other["condition"] == COACH)]
        for metric in CARD_METRICS:
            values = rows.groupby("query_id")[metric].mean().dropna()
            if not values.empty:
                assert card["metrics"][metric]["value"] == pytest.approx(values.mean(), abs=1e-4), metric
        # Run 1 holds no scores of this judge: no change, and the card says why.
        assert card["comparison"]["paired"] is False
        assert card["comparison"]["note"] == (f"run {first} was scored by the judge offline/rules and this card by "
                                              f"{Contrarian.model}; scores of different judges are not compared")
    mixed = card_of(cards, SYCOPHANT, COACH)
    assert f"- Judge: {Contrarian.model} (re-scored; the run's own judge is offline/rules)" in card_markdown_of(
        engine, second, SYCOPHANT, COACH)
    # Once run 1 holds that judge's scores too, the change is made on them.
    rescore(engine, first, Contrarian.model, judge=Contrarian(), progress=False)
    card = card_of(write_cards(engine, second, judge_model=Contrarian.model), SYCOPHANT, COACH)
    assert card["comparison"] == {"paired": True, "note": None}
    assert mixed["metrics"] == card["metrics"]
    before = load_frame(engine, first, Contrarian.model)
    part = before[(before["model"] == SYCOPHANT) & (before["condition"] == COACH)]
    now = other[(other["model"] == SYCOPHANT) & (other["condition"] == COACH)]
    both = pd.concat({"now": now.groupby("query_id")["affirmed"].mean(),
                      "before": part.groupby("query_id")["affirmed"].mean()}, axis=1).dropna()
    expected = paired_difference(both["now"].to_numpy(float), both["before"].to_numpy(float))
    assert card["change"]["affirmed"] == pytest.approx(expected["difference"], abs=1e-4)

    # The report: the other judge's numbers, said to be the other judge's.
    page = html.unescape(render_report(engine, second, Contrarian.model))
    assert f"<dt>Judge</dt><dd>{Contrarian.model} (re-scored; the run's own judge is offline/rules)" in page
    assert render_report(engine, second, Contrarian.model) != render_report(engine, second)
    with pytest.raises(NotFound, match=f"run {second} has no scores by openai/other .*afterward eval rescore"):
        render_report(engine, second, "openai/other")
    out = tmp_path / "report.html"
    result = cli("eval", "report", second, "--out", out, "--judge", Contrarian.model)
    assert result.exit_code == 0, result.output
    assert out.read_text(encoding="utf-8") != render_report(engine, second)
    result = cli("eval", "report", second, "--out", out, "--judge", "openai/other")
    assert result.exit_code == 1
    assert "afterward eval rescore" in result.output
    result = cli("eval", "cards", "--run", second, "--judge", Contrarian.model)
    assert result.exit_code == 0, result.output
    assert f"[judge {Contrarian.model}]" in result.output
    # Without --judge, the run's own judge's cards again.
    cards = write_cards(engine, second)
    assert {card["judge"] for card in cards} == {"offline/rules"}


def card_markdown_of(engine: Engine, run_id: int, model: str, condition: str) -> str:
    with session_scope(engine, read_only=True) as session:
        found = session.scalar(select(EvalModelCard.markdown).where(
            EvalModelCard.run_id == run_id, EvalModelCard.model == model, EvalModelCard.condition == condition))
    assert found is not None
    return found


def test_the_gates_read_another_judge_and_a_baseline_it_rescored(engine: Engine, tmp_path: Path) -> None:
    first = evaluate_grid(engine, tmp_path, "b1", f"models: [{PLAIN}]\nconditions: [{COACH}]\nlimit_queries: 6\n"
                                             "gates:\n  - {rule: rate, metric: affirmed, at_most: 0.9}\n")
    rescore(engine, first, Contrarian.model, judge=Contrarian(), progress=False)
    own, other = judge_run(engine, first), judge_run(engine, first, Contrarian.model)
    assert own.lines()[-1] == f"run {first}: gates PASSED"
    assert other.lines()[-1].endswith(f"on the scores of {Contrarian.model}, not the run's judge")
    frame = load_frame(engine, first, Contrarian.model)
    values = frame.groupby("query_id")["affirmed"].mean().dropna()
    [check] = other.checks
    assert (check.figure, check.n) == (pytest.approx(values.mean()), len(values))
    assert own.checks[0].figure != check.figure  # the run's judge and the other disagree: two readings
    # A grid judged by that judge may name the run as its baseline once it holds that judge's scores.
    grid = parse_grid(f"name: b2\nmodels: [{PLAIN}]\nconditions: [{COACH}]\nlimit_queries: 6\n"
                      f"judge: openai/other\nbaseline: {{run: {first}, condition: {COACH}}}\n")
    with pytest.raises(GridError, match=f"afterward eval rescore {first} --judge openai/other scores it"):
        check_baseline(engine, plan(grid, tmp_path))
    rescored = parse_grid(f"name: b3\nmodels: [{PLAIN}]\nconditions: [{COACH}]\nlimit_queries: 6\n"
                          f"judge: {Contrarian.model}\nbaseline: {{run: {first}, condition: {COACH}}}\n")
    assert check_baseline(engine, plan(rescored, tmp_path)) is not None
