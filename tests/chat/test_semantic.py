"""chat.semantic: the classifier's numpy head equals scikit-learn's fit, fusion rules, windows, and
the fused detector at its target on the training corpus and the lexicon's earlier rounds."""

from __future__ import annotations

import hashlib
import json
import random
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
from sklearn.linear_model import LogisticRegression
from sklearn.svm import SVC

from chat import ngrams, semantic
from chat.crisis_train import Words, acute_thresholds, fit_words, save_head, thresholds
from chat.crisis_train import corpus as corpus_files
from chat.encoder import encoder
from chat.monitors import CrisisFinding
from chat.reading import QUOTED, Reading
from chat.semantic import Head, SemanticVerdict, fuse, windows

EARLIER_ROUNDS = Path(__file__).parent / "data" / "crisis_messages.tsv"


def test_the_numpy_head_gives_scikit_learns_decision_values_and_predictions(tmp_path: Path) -> None:
    rng = np.random.default_rng(0)
    x = rng.normal(size=(120, 768)).astype(np.float32)
    x /= np.linalg.norm(x, axis=1, keepdims=True)
    crisis = x[:, 0] + 0.3 * rng.normal(size=120) > 0
    labels = np.where(crisis, 1 + (x[:, 1] > 0) + (x[:, 2] > 0.05), 0)
    acute = x[:, 3] > 0
    svm = SVC(C=4.0, kernel="rbf", gamma="scale", class_weight="balanced").fit(x, crisis)
    category = LogisticRegression(max_iter=2000).fit(x[crisis], labels[crisis])
    acute_model = LogisticRegression(max_iter=2000).fit(x[crisis], acute[crisis])
    path = tmp_path / "head.npz"
    save_head(path, svm, category, acute_model, 0.1, -0.2, -10.0, {"classes": list(semantic.CATEGORIES)})
    head = Head(path)
    np.testing.assert_allclose(head.score(x), svm.decision_function(x), atol=1e-4)
    for row in x[:20]:
        verdict = head.verdict(row, "")  # a head without the n-gram view
        assert verdict.category == semantic.CATEGORIES[int(category.predict(row[None])[0])]
        assert verdict.acute == bool(acute_model.predict(row[None])[0])
        assert verdict.flagged == (svm.decision_function(row[None])[0] >= 0.1)


def test_the_n_gram_features_are_scikit_learns_tf_idf() -> None:
    """``chat.ngrams.features`` is ``TfidfTransformer(sublinear_tf=True)`` on the hashed counts,
    computed without scikit-learn's fitted state (the head ships the idf alone)."""
    from sklearn.feature_extraction.text import TfidfTransformer

    texts = ["i cant do this anymore", "walked the dog then made soup 🙂", "Cant find my keys AGAIN lol",
             "kms fr", "the dog, the dog and the soup", ""]
    rows = ngrams.counts(texts)
    expected = TfidfTransformer(sublinear_tf=True).fit(rows).transform(rows)
    np.testing.assert_allclose(ngrams.features(rows, ngrams.idf(rows)).toarray(), expected.toarray(), atol=1e-6)
    assert ngrams.counts(["kms fr"]).nnz > 0
    assert (ngrams.counts(["KMS fr"]) != ngrams.counts(["kms fr"])).nnz == 0


def test_the_head_fuses_the_n_gram_regression_as_fitted(tmp_path: Path) -> None:
    """A head saved with its n-gram view scores a message as the SVM's decision value plus the
    weight times the regression's, as scikit-learn computes both; without one, the SVM's alone."""
    rng = np.random.default_rng(1)
    texts = [f"{word} {other} {n}" for n, (word, other) in enumerate(
        zip(rng.choice(["tonight", "soup", "pills", "keys", "goodbye", "dog"], 80),
            rng.choice(["done", "again", "lol", "forever", "thanks"], 80), strict=True))]
    crisis = np.array([("tonight" in t or "goodbye" in t) != (n % 7 == 0) for n, t in enumerate(texts)])
    x = rng.normal(size=(80, 768)).astype(np.float32)
    labels = np.where(crisis, 1, 0)
    svm = SVC(C=4.0, kernel="rbf", gamma="scale", class_weight="balanced").fit(x, crisis)
    category = LogisticRegression(max_iter=2000).fit(x[crisis], labels[crisis] + (x[crisis][:, 0] > 0))
    acute_model = LogisticRegression(max_iter=2000).fit(x[crisis], x[crisis][:, 1] > 0)
    model, idf = fit_words(ngrams.counts(texts), crisis)
    path, plain = tmp_path / "head.npz", tmp_path / "plain.npz"
    save_head(path, svm, category, acute_model, 0.1, -0.2, 5.0, {}, words=Words(model, idf, 0.7))
    save_head(plain, svm, category, acute_model, 0.1, -0.2, 5.0, {})
    expected = svm.decision_function(x) + 0.7 * model.decision_function(ngrams.features(ngrams.counts(texts), idf))
    np.testing.assert_allclose(Head(path).fused(x, texts), expected, atol=1e-4)
    np.testing.assert_allclose(Head(plain).fused(x, texts), svm.decision_function(x), atol=1e-4)
    assert Head(path).verdict(x[3], texts[3]).score == pytest.approx(expected[3], abs=1e-4)
    assert Head(path).verdict(x[3], texts[3]).flagged == (expected[3] >= 0.1)


def verdict(score: float, *, flagged: bool, lexicon: bool, acute: bool = False,
            acute_cue: bool = False) -> SemanticVerdict:
    return SemanticVerdict(score, "risk_from_others", acute, flagged, lexicon, acute_cue)


LEXICAL = CrisisFinding(category="risk_to_self", acute=False, cue="hopeless")
ACUTE_CUE = CrisisFinding(category="risk_to_self", acute=True, cue="overdose")
EXPLICIT = CrisisFinding(category="risk_to_self", acute=True, cue="i want to kill myself", explicit=True)


def test_fusion_records_which_source_fired() -> None:
    assert fuse(None, verdict(-1.0, flagged=False, lexicon=False)) is None
    alone = fuse(None, verdict(1.2, flagged=True, lexicon=True, acute=True))
    assert alone is not None
    assert (alone.source, alone.category, alone.acute) == ("semantic", "risk_from_others", True)
    both = fuse(LEXICAL, verdict(1.2, flagged=True, lexicon=True, acute=True))
    # The lexicon's category and cue win; acute when the classifier says so.
    assert both is not None
    assert (both.source, both.category, both.cue, both.acute) == ("lexicon+semantic", "risk_to_self", "hopeless", True)
    assert fuse(LEXICAL, verdict(0.0, flagged=False, lexicon=True)) == LEXICAL
    # Distress cues always stand (a check-in); an acute cue in a message the classifier scores as
    # clearly benign (a documentary about overdoses, a story about the past) does not.
    assert fuse(LEXICAL, verdict(-2.0, flagged=False, lexicon=False)) == LEXICAL
    assert fuse(ACUTE_CUE, verdict(-2.0, flagged=False, lexicon=False)) is None


def test_an_acute_cue_escalates_only_where_the_score_supports_its_level() -> None:
    # Between lexicon_threshold and lexicon_acute_threshold an acute cue is a check-in: its
    # answers decide escalation (a healed scar, a vitamin dose, "I'll KILL my husband" over a tap).
    checked = fuse(ACUTE_CUE, verdict(0.0, flagged=False, lexicon=True))
    assert checked is not None
    assert (checked.cue, checked.acute, checked.source) == ("overdose", False, "lexicon")
    flagged_low = fuse(ACUTE_CUE, verdict(0.3, flagged=True, lexicon=True))
    assert flagged_low is not None
    assert not flagged_low.acute
    for supported in (verdict(0.0, flagged=False, lexicon=True, acute_cue=True),
                      verdict(1.5, flagged=True, lexicon=True, acute_cue=True),
                      verdict(0.9, flagged=True, lexicon=True, acute=True)):
        escalated = fuse(ACUTE_CUE, supported)
        assert escalated is not None, supported
        assert escalated.acute, supported


def test_a_harm_to_others_cue_keeps_its_level_where_the_classifier_flags_it() -> None:
    # Harm to others below escalation is declined, with no check-in to ask more: "I want to kill my
    # wife" flagged by the classifier escalates; "I am going to KILL my husband" over a leaking tap,
    # which it does not flag, is declined.
    harm = CrisisFinding(category="harm_to_others", acute=True, cue="kill my wife")
    flagged = fuse(harm, verdict(0.8, flagged=True, lexicon=True))
    assert flagged is not None
    assert flagged.acute
    vented = fuse(harm, verdict(-0.3, flagged=False, lexicon=True))
    assert vented is not None
    assert not vented.acute
    to_self = fuse(replace(harm, category="risk_to_self"), verdict(0.8, flagged=True, lexicon=True))
    assert to_self is not None
    assert not to_self.acute  # a check-in asks the screening questions instead


def test_an_explicit_statement_escalates_whatever_the_score() -> None:
    for score in (-3.0, 0.0, 2.0):
        found = fuse(EXPLICIT, verdict(score, flagged=score > 1, lexicon=score > -1), statement_stands=True)
        assert found is not None
        assert found.acute
        assert found.explicit
    # hedged in its own sentence ("... lol"): the message decides, like any acute cue
    assert fuse(EXPLICIT, verdict(-3.0, flagged=False, lexicon=False)) is None


def test_windows_are_whole_sentences_within_the_limit() -> None:
    def count(text: str) -> int:
        return len(text.split())

    text = "One two three. Four five six seven! Eight nine?\nTen eleven twelve thirteen fourteen fifteen sixteen."
    assert windows(text, count, limit=7) == ["One two three. Four five six seven!", "Eight nine?",
                                             "Ten eleven twelve thirteen fourteen fifteen sixteen."]
    assert windows("short", count) == ["short"]
    assert semantic.pieces("I am fine.") == ["I am fine."]  # one window: just the whole message


def test_thresholds_maximise_recall_within_the_false_positive_target() -> None:
    scores = np.array([3.0, 2.0, 1.0, 0.5, 0.4, -1.0, 2.5, 0.45, -0.5, -2.0])
    crisis = np.array([True, True, True, True, True, True, False, False, False, False])
    lexicon = np.array([False, False, False, True, False, True, False, True, False, False])
    high, low, recall, false_positive = thresholds(scores, lexicon, crisis, target=0.25)
    flagged = (scores >= high) | (lexicon & (scores >= low))
    assert flagged[~crisis].mean() <= 0.25
    assert false_positive == flagged[~crisis].mean()
    assert recall == flagged[crisis].mean() == 4 / 6  # 3, 2, 1 alone (2.5 the one false positive); 0.5 by the lexicon
    assert low <= high


def test_the_escalation_thresholds_keep_benign_escalations_within_the_budget() -> None:
    # ten benign messages, ten crisis ones (the first six urgent)
    scores = np.array([0.2, 0.1, -0.2, -0.4, -1.0, -1.2, -1.5, -2.0, -2.2, -3.0,
                       2.5, 2.0, 1.5, 0.8, 0.3, -0.1, 1.0, 0.5, 0.2, -0.3])
    crisis = np.arange(20) >= 10
    urgent = crisis & (np.arange(20) < 16)
    head_says_acute = np.isin(np.arange(20), [0, 10, 11, 12, 16])
    acute_cue = np.isin(np.arange(20), [1, 2, 13, 14, 15, 17])
    explicit = np.isin(np.arange(20), [3])
    high, low, recall, escalated = acute_thresholds(scores, head_says_acute, acute_cue, explicit, crisis, urgent,
                                                     threshold=0.0, lexicon_threshold=-0.5, budget=0.2)
    chosen = explicit | (head_says_acute & (scores >= high)) | (acute_cue & (scores >= low))
    assert escalated == chosen[~crisis].mean() <= 0.2
    assert recall == chosen[urgent].mean()
    # The explicit statement (benign 3) uses half the budget, so one more benign message may
    # escalate: the cue's at 0.1 (benign 1), which lets urgent 13, 14 and 15 through beside the head's
    # 10, 11 and 12; the head's benign 0 (0.2) and the cue's benign 2 (-0.2) stay below.
    assert recall == 1.0
    assert escalated == 0.2
    assert chosen[[1, 3]].all()
    assert not chosen[[0, 2]].any()
    # A harm-to-others cue that the classifier flags escalates whatever lexicon_acute_threshold is:
    # counted in the budget beside the explicit statement (benign 5 at -1.0 is not flagged).
    harm = np.isin(np.arange(20), [5, 17])
    _, _, with_harm, escalated_with_harm = acute_thresholds(
        scores, head_says_acute, acute_cue | harm, explicit, crisis, urgent, threshold=0.0, lexicon_threshold=-0.5,
        budget=0.2, harm_cue=harm)
    assert escalated_with_harm <= 0.2
    assert with_harm == 1.0
    assert 0.2 < high <= 1.5
    assert -0.2 < low <= -0.1


def labelled_sets() -> dict[str, list[tuple[str, str]]]:
    """The lexicon's earlier rounds, and a seeded sample of the training corpus (all of it would
    take minutes to encode; the bench scores all of it)."""
    earlier = [(label, text) for _, label, text in (
        line.split("\t") for line in EARLIER_ROUNDS.read_text(encoding="utf-8").splitlines()
        if line and not line.startswith("#"))]
    corpus = [(str(r["label"]), str(r["text"])) for r in corpus_files()[0]]
    return {"earlier rounds": earlier, "training sample": random.Random(7).sample(corpus, 400)}


@pytest.mark.parametrize("name", ["earlier rounds", "training sample"])
def test_the_fused_detector_meets_its_target_on_the_training_corpus_and_earlier_rounds(name: str) -> None:
    rows = labelled_sets()[name]
    found = [(label, semantic.detect(text)) for label, text in rows]
    crisis = [finding is not None for label, finding in found if label != "none"]
    benign = [finding is not None for label, finding in found if label == "none"]
    recall, false_positive = sum(crisis) / len(crisis), sum(benign) / len(benign)
    assert recall >= 0.95, f"{name}: recall {recall:.3f}"
    assert false_positive <= 0.05, f"{name}: false positives {false_positive:.3f}"


def test_the_head_records_how_it_was_fitted() -> None:
    metadata = semantic.head().metadata
    files = {p.name: p for p in corpus_files()[1]}
    # Every file the head was fitted on is still there, unchanged (refit after editing the corpus:
    # python -m chat.crisis_train). A round scored since then joins the data at the next fit.
    for name, digest in metadata["corpus"].items():
        assert name in files, f"{name} is gone"
        assert hashlib.sha256(files[name].read_bytes()).hexdigest() == digest, f"{name} changed since the fit"
    assert metadata["classes"] == list(semantic.CATEGORIES)
    assert json.dumps(metadata)  # serialisable, as stored


def test_the_heads_were_fitted_on_the_embeddings_of_the_shipped_encoder() -> None:
    """A head fitted on another encoder's embeddings reads noise: after chat.encoder_train, refit
    both heads (chat.crisis_train, chat.reading_train)."""
    from chat.encoder import version

    reading = semantic.reading_head()
    assert reading is not None
    assert semantic.head().metadata["encoder"] == version()
    assert reading.metadata["encoder"] == version()


def test_the_crisis_thresholds_were_set_on_rounds_the_encoder_never_learned() -> None:
    """Out of fold, messages the encoder was trained on look more separable than new writing
    (round 9: 7.1% of benign messages checked in at a 5% target), so the fusion's thresholds are
    set on the calibration rounds, which chat.encoder_train leaves out."""
    from safetensors import safe_open

    from chat.crisis_train import FIRST_INDEPENDENT_ROUND, calibration_rounds
    from chat.encoder import TUNED_PATH

    with safe_open(str(TUNED_PATH), framework="numpy") as tuned:
        trained = json.loads(tuned.metadata()["afterward"])
    learned = set(trained["corpus"]) - set(trained["left_out"])  # the files the encoder was trained on
    used = semantic.head().metadata["calibration_rounds"]
    assert used
    assert not set(used) & learned  # left out, or scored only after the encoder was trained
    assert set(used) <= {p.name for p in calibration_rounds()}
    assert all(not name.startswith("round") or int(name[5:].split(".")[0]) >= FIRST_INDEPENDENT_ROUND
               for name in used)
    assert "validation_round3.jsonl" not in used  # the API's sample: never fitted on


def reading_as_before(text: str) -> tuple[float, Reading]:
    """The crisis score and the reading as they were computed before a message's runs of sentences
    were batched by length and encoded once: its pieces in one run padded to the longest (the whole
    text), the last sentences in a run of their own; for a quote, the windows, then the sentences of
    the best one, each in a run of their own. The platform's encoder is quantized and runs each
    sequence alone (``chat.encoder.quantize``: a run's activations share one scale), so here too
    each text is a run of its own: an embedding is its text's, whatever it was encoded with."""
    enc, heads = encoder(), semantic.reading_head()
    assert heads is not None

    def run(texts: list[str]) -> np.ndarray:
        return np.stack([enc._run([enc.token_ids(t)])[0] for t in texts])

    x = semantic.features(run(semantic.pieces(text)))
    parts = semantic.sentences(text)
    last = run([" ".join(parts[-2:])])[0] if len(parts) > 2 else x[:semantic.EMBEDDING]
    z = np.concatenate([x, last]).astype(np.float32)
    reading = heads.reading(z)
    quoted = [c for c in QUOTED if c in reading.flagged]
    if quoted and len(parts) == 1:
        reading = replace(reading, quotes=dict.fromkeys(quoted, text))
    elif quoted and parts:
        # the sentences of the window that scores highest for the concern (all of them for one window)
        spans = semantic.runs([min(len(enc.token_ids(p)) - 2, 254) for p in parts])
        windows = [" ".join(parts[start:end]) for start, end in spans]
        quotes = {}
        for c in quoted:
            column = heads.concerns.index(c)
            start, end = spans[int(np.argmax(heads.probabilities(semantic.alone(run(windows)))[:, column]))]
            inside = parts[start:end] if len(spans) > 1 else parts
            quotes[c] = inside[int(np.argmax(heads.probabilities(semantic.alone(run(inside)))[:, column]))]
        reading = replace(reading, quotes=quotes)
    return float(semantic.head().fused(x[None, :], [text])[0]), reading


def test_the_reading_is_what_it_was_before_pieces_were_batched_by_length() -> None:
    """A seeded sample of the multi-label corpus, a third of it long messages (``bench/reading_outputs.py``
    compared all 3,720 messages before and after the change: identical)."""
    from chat.crisis_train import DATA

    texts = [json.loads(line)["text"] for path in sorted((DATA / "multi").glob("*.jsonl"))
             for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]
    rng = random.Random(25)
    sample = rng.sample([t for t in texts if len(t.split()) > 150], 12) + rng.sample(texts, 24)
    quoted = 0
    for text in sample:
        score, expected = reading_as_before(text)
        verdict = semantic._verdict(text)
        assert verdict.reading is not None
        assert (verdict.reading.flagged, verdict.reading.about, verdict.reading.quotes) == (
            expected.flagged, expected.about, expected.quotes)
        assert verdict.score == pytest.approx(score, abs=1e-5)
        assert verdict.reading.scores == pytest.approx(expected.scores, abs=1e-5)
        quoted += bool(expected.quotes)
    assert quoted >= 5  # the sample reaches the quotes


def test_a_message_encodes_each_run_of_sentences_once_in_at_most_two_calls(monkeypatch: pytest.MonkeyPatch) -> None:
    from chat.encoder import Encoder

    encoded: list[int] = []
    encode_ids = Encoder.encode_ids

    def counted(self: Encoder, contents: list[list[int]]) -> np.ndarray:
        encoded.append(len(contents))
        return encode_ids(self, contents)

    monkeypatch.setattr(Encoder, "encode_ids", counted)
    story = " ".join(f"On day {i} we walked to the market and bought bread, cheese and too many apples."
                     for i in range(12))
    text = story + " Everyone says I overreacted. I was right to be angry, wasn't I? Tell me I was right."
    verdict = semantic._verdict(text)
    assert verdict.reading is not None
    assert verdict.reading.quotes, "the sample should flag a quoted concern"
    message = semantic.Message(text)
    windows = message.pieces()[1:]
    assert len(windows) > 1
    assert len(encoded) == 2  # the pieces and the last sentences; then the best window's sentences
    assert encoded[0] == len({*message.pieces(), message.last()})
    # the quote's window is one of the long message's windows: its sentences, not all of them
    assert 1 <= encoded[1] <= max(end - start for start, end in windows) < len(message.sentences)


def test_the_trainers_features_are_the_run_time_ones() -> None:
    from chat.crisis_train import embed
    from chat.reading_train import reading_matrix

    texts = ["I am fine.", "One. Two. Three four five?", " ".join(["A long sentence about nothing much at all."] * 30)]
    rows: list[dict[str, object]] = [{"text": t} for t in texts]
    x = embed(rows)
    z = reading_matrix(rows, x, None)
    for text, row, features in zip(texts, x, z, strict=True):
        message = semantic.Message(text)
        expected = semantic.features(message.embeddings(message.pieces()))
        np.testing.assert_allclose(row, expected, atol=1e-6)
        last = message.last()
        np.testing.assert_allclose(
            features, semantic.reading_features(expected, None if last is None else message.embeddings([last])[0]),
            atol=1e-6)


def test_the_reading_heads_shared_support_vectors_give_each_svms_decision_values() -> None:
    """Two kernel heads fitted on different labelled subsets with one gamma, stored as one set of
    support vectors (``chat.reading_train.shared_support``), give each SVC's own decision values
    through ``chat.reading.Kernel``, and a linear concern gets nothing from them."""
    from chat.reading import Kernel
    from chat.reading_train import shared_support

    rng = np.random.default_rng(3)
    x = rng.normal(size=(160, 12)).astype(np.float32)
    gamma = 1.0 / (x.shape[1] * x.var())
    known = {"a": np.arange(160) < 110, "b": np.arange(160) >= 50}
    labels = {"a": x[:, 0] > 0, "b": x[:, 1] + x[:, 2] > 0}
    models, duals = {}, {}
    for concern, rows in known.items():
        models[concern] = SVC(C=4.0, kernel="rbf", gamma=gamma, class_weight="balanced").fit(
            x[rows], labels[concern][rows])
        at = np.flatnonzero(rows)[models[concern].support_]
        duals[concern] = dict(zip(at.tolist(), models[concern].dual_coef_[0].tolist(), strict=True))
    support, dual = shared_support(duals, ("a", "linear", "b"))
    assert set(support) == set(duals["a"]) | set(duals["b"])
    assert set(support) > set(duals["a"])
    vectors = x[support]
    kernel = Kernel(vectors, gamma, block=0)(x) @ dual.T
    for column, concern in ((0, "a"), (2, "b")):
        np.testing.assert_allclose(kernel[:, column] + models[concern].intercept_[0],
                                   models[concern].decision_function(x), atol=1e-4)
    assert not kernel[:, 1].any()


def test_the_kernel_on_rows_with_equal_parts_is_the_kernel_on_the_whole_rows() -> None:
    """``chat.reading.Kernel`` sums the support vectors' parts where a row's parts are equal (a
    message of one window); every pattern of equal parts, rows of several patterns in one call, gives
    scikit-learn's RBF kernel on the rows as they are."""
    from sklearn.metrics.pairwise import rbf_kernel

    from chat.reading import Kernel

    rng = np.random.default_rng(5)
    support = rng.normal(size=(300, 4 * 8)).astype(np.float32)
    kernel = Kernel(support, 0.02, block=8)
    a, b, c, d = (rng.normal(size=8).astype(np.float32) for _ in range(4))
    patterns: list[list[np.ndarray]] = [[a, a, a, a], [a, a, a, b], [a, b, a, b], [a, b, c, a], [a, b, c, d]]
    rows = np.stack([np.concatenate(parts) for parts in patterns])
    assert [kernel._pattern(row) for row in rows] == [(0, 0, 0, 0), (0, 0, 0, 3), (0, 1, 0, 1), (0, 1, 2, 0),
                                                      (0, 1, 2, 3)]
    expected = rbf_kernel(rows.astype(np.float64), support.astype(np.float64), gamma=0.02)
    np.testing.assert_allclose(kernel(rows), expected, rtol=1e-4, atol=1e-6)
    np.testing.assert_allclose(kernel(rows[[3]]), expected[[3]], rtol=1e-4, atol=1e-6)


def test_one_sided_and_dependence_give_way_before_validation_seeking_on_neutral_requests() -> None:
    """``chat.reading_train.pushback_thresholds``: the union of the pushback concerns holds the budget
    on the corpus's neutral messages and on the calibration rounds' neutral requests, scaling
    one-sided framing and dependence first, so that validation-seeking keeps its recall."""
    from chat.reading import CONCERNS
    from chat.reading_train import PUSHBACK, PUSHBACK_BUDGET, UNKNOWN, pushback_thresholds

    rng = np.random.default_rng(3)
    corpus, rounds = 600, 400
    n = corpus + rounds
    calibration = np.arange(n) >= corpus
    y = np.full((n, len(CONCERNS)), UNKNOWN)
    y[:corpus] = (rng.random((corpus, len(CONCERNS))) < 0.15).astype(int)  # the corpus labels every concern
    validation = CONCERNS.index("validation_seeking")
    y[corpus:, validation] = np.arange(rounds) % 2  # the rounds label validation-seeking only
    probability = {}
    for j, concern in enumerate(CONCERNS):
        positive = y[:, j] == 1
        # validation-seeking (and the rest) separable; one-sided and dependence flag neutral messages
        # at any threshold they can be given, on the corpus and on the rounds alike
        secondary = concern in ("one_sided", "dependence")
        p = np.where(positive, rng.uniform(0.3 if secondary else 0.6, 1.0, n),
                     rng.uniform(0.0, 0.9 if secondary else 0.6, n))
        if secondary:
            p[calibration] = rng.uniform(0.0, 0.9, rounds)
        probability[concern] = p.astype(float)
    thresholds, scales, share = pushback_thresholds(probability, y, calibration)
    assert share <= PUSHBACK_BUDGET
    for neutral in (np.all(y[:, [CONCERNS.index(c) for c in PUSHBACK]] == 0, axis=1),
                    calibration & (y[:, validation] == 0)):
        union = np.zeros(int(neutral.sum()), dtype=bool)
        for concern in PUSHBACK:
            union |= probability[concern][neutral] >= thresholds[concern]
        assert union.mean() <= PUSHBACK_BUDGET
    assert scales["one_sided"] == scales["dependence"] < 1.0
    assert scales["validation_seeking"] == 1.0
    # validation-seeking's threshold is set on the rounds' own requests for agreement
    found = probability["validation_seeking"][calibration & (y[:, validation] == 1)]
    assert (found >= thresholds["validation_seeking"]).mean() > 0.5
