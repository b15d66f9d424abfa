"""chat.encoder: the numpy all-MiniLM-L6-v2 gives sentence-transformers' embeddings."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from chat.encoder import MAX_TOKENS, TUNED_PATH, Encoder, encoder, model_dir

REFERENCE = Path(__file__).parent / "data" / "minilm_reference.json"


def test_embeddings_match_sentence_transformers_for_the_same_model() -> None:
    reference = json.loads(REFERENCE.read_text(encoding="utf-8"))
    assert reference["max_seq_length"] == MAX_TOKENS
    expected = np.array(reference["embeddings"], dtype=np.float64)
    enc = Encoder(model_dir(), tuned=None)  # the published model
    together = enc.encode(reference["sentences"])  # padded to the longest: the mask must hide padding
    one_by_one = np.stack([enc.encode([s])[0] for s in reference["sentences"]])
    np.testing.assert_allclose(together, expected, atol=2e-6)
    np.testing.assert_allclose(one_by_one, expected, atol=2e-6)
    assert np.allclose(np.linalg.norm(together, axis=1), 1.0, atol=1e-5)
    # The long sentence really was longer than the model's window (truncated as in the reference).
    assert len(enc.token_ids(reference["sentences"][-1])) == MAX_TOKENS


def test_the_tuned_file_replaces_the_last_layers_and_nothing_else() -> None:
    """chat/encoder_train.py trains the last ``TRAINED`` layers: the shipped file holds their
    tensors, with the published shapes, and the platform's encoder reads them (its embeddings are
    not the base's)."""
    from safetensors.numpy import load_file

    from chat.encoder_train import FIRST, TRAINED

    tuned = load_file(str(TUNED_PATH))
    base = load_file(str(model_dir() / "model.safetensors"))
    layers = {str(i) for i in range(FIRST, FIRST + TRAINED)}
    assert {name.split(".")[2] for name in tuned} == layers
    assert {name for name in base if name.startswith("encoder.layer.") and name.split(".")[2] in layers} == set(tuned)
    assert all(tuned[name].shape == base[name].shape for name in tuned)
    text = ["help me plan a birthday dinner for six"]
    published, platform = Encoder(model_dir(), tuned=None).encode(text), encoder().encode(text)
    assert np.allclose(np.linalg.norm(platform, axis=1), 1.0, atol=1e-5)
    assert not np.allclose(published, platform, atol=1e-3)


def test_the_platforms_quantized_encoder_stays_close_to_the_float_one() -> None:
    """``encoder()`` runs the weights' products in 8-bit integers (``chat.encoder.quantize``): each
    embedding of the reference sentences stays within a small angle of the float model's with the
    same tuned layer, and is not the float one (the quantized graph really runs)."""
    reference = json.loads(REFERENCE.read_text(encoding="utf-8"))
    texts = [*reference["sentences"], "i wanna sleep and not wake up lol", "can u check my cover letter pls"]
    exact, platform = Encoder(model_dir(), TUNED_PATH).encode(texts), encoder().encode(texts)
    cosines = (exact * platform).sum(axis=1)
    assert cosines.min() >= 0.97, cosines
    assert not np.allclose(exact, platform, atol=1e-4)


def test_similar_meanings_are_closer_than_shared_words() -> None:
    enc = encoder()
    a, b, c = enc.encode(["I want to end my life", "I don't want to be alive anymore", "this deadline is killing me"])
    assert float(a @ b) > float(a @ c)



def test_a_messages_pieces_have_the_ids_of_their_text_built_from_its_sentences() -> None:
    """``chat.semantic.Message`` tokenizes a message's sentences once and joins their ids for its
    whole text, windows and last sentences: the same ids as tokenizing each text (every message
    of the multi-label corpus), framed and truncated as the tokenizer truncates."""
    from tokenizers import Tokenizer

    from chat.crisis_train import DATA
    from chat.encoder import model_dir
    from chat.semantic import sentences

    enc = encoder()
    truncating = Tokenizer.from_file(str(model_dir() / "tokenizer.json"))
    truncating.enable_truncation(max_length=MAX_TOKENS)
    truncating.no_padding()
    texts = [json.loads(line)["text"] for path in sorted((DATA / "multi").glob("*.jsonl"))
             for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]
    texts += ["", "  \n ", "Ein Satz.\u00a0Zwei?!\n\n\tdrei… 東京に行く。ok", "word " * 400]
    for text in texts:
        parts = sentences(text)
        ids = enc.content_ids(parts)
        joined = [token for sentence in ids for token in sentence]
        assert joined == enc.content_ids([text])[0]
        assert enc.token_ids(text) == list(truncating.encode(text).ids)
        if len(parts) > 2:
            assert [t for sentence in ids[-2:] for t in sentence] == enc.content_ids([" ".join(parts[-2:])])[0]


def test_batches_cover_every_sequence_once_and_pad_little() -> None:
    from chat.encoder import RUN_TOKENS, SHARED_TOKENS, batches, shares

    assert batches([]) == []
    lengths = [258, 66, 60, 62, 40, 12, 66]
    runs = batches(lengths)
    assert sorted(i for run in runs for i in run) == list(range(len(lengths)))
    assert runs[0] == [0]  # the whole text of a long message alone: its windows are not padded to it
    cost = sum(RUN_TOKENS + len(run) * max(lengths[i] for i in run) for run in runs)
    assert cost <= RUN_TOKENS + len(lengths) * 258  # no worse than one run
    assert cost <= len(lengths) * RUN_TOKENS + sum(lengths)  # nor than a run each
    mine, theirs = shares(runs, lengths)  # a long message's runs: the helper thread may take some
    with_whole = mine if [0] in mine else theirs
    assert not any(1 in run for run in with_whole)  # the whole text and the windows on different threads
    assert sorted(i for run in mine + theirs for i in run) == list(range(len(lengths)))
    assert theirs
    assert shares([[0], [1]], [20, 10]) == ([[0], [1]], [])  # a short message stays on its thread
    assert sum(lengths) > SHARED_TOKENS
    vectors = encoder().encode_ids([[2000 + i] * n for i, n in enumerate(lengths)])
    one_by_one = np.stack([encoder().encode_ids([[2000 + i] * n])[0] for i, n in enumerate(lengths)])
    np.testing.assert_allclose(vectors, one_by_one, atol=1e-6)
