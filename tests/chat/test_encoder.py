"""chat.encoder: the numpy all-MiniLM-L6-v2 gives sentence-transformers' embeddings."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from chat.encoder import MAX_TOKENS, encoder

REFERENCE = Path(__file__).parent / "data" / "minilm_reference.json"


def test_embeddings_match_sentence_transformers_for_the_same_model() -> None:
    reference = json.loads(REFERENCE.read_text(encoding="utf-8"))
    assert reference["max_seq_length"] == MAX_TOKENS
    expected = np.array(reference["embeddings"], dtype=np.float64)
    enc = encoder()
    together = enc.encode(reference["sentences"])  # padded to the longest: the mask must hide padding
    one_by_one = np.stack([enc.encode([s])[0] for s in reference["sentences"]])
    np.testing.assert_allclose(together, expected, atol=2e-6)
    np.testing.assert_allclose(one_by_one, expected, atol=2e-6)
    assert np.allclose(np.linalg.norm(together, axis=1), 1.0, atol=1e-5)
    # The long sentence really was longer than the model's window (truncated as in the reference).
    assert len(enc.token_ids(reference["sentences"][-1])) == MAX_TOKENS


def test_similar_meanings_are_closer_than_shared_words() -> None:
    enc = encoder()
    a, b, c = enc.encode(["I want to end my life", "I don't want to be alive anymore", "this deadline is killing me"])
    assert float(a @ b) > float(a @ c)

