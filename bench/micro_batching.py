"""Whether encoding concurrent chat messages together (micro-batching) would pay, measured.

    .venv/bin/python bench/micro_batching.py [--messages 96] [--batch 8] [--repeats 3]

Issue 29 asked for the reading of concurrent messages to be micro-batched. The platform's encoder is
quantized (``chat.encoder.quantize``: ONNX Runtime's dynamic quantization), whose activations take
one 8-bit scale per run: in a run of several messages each embedding would depend on the others
(and on their padding). This prints, on the first ``--messages`` of round 11 (held out, scored;
here only timed), each message's text encoded as one sequence, the CPU milliseconds per message
(best of ``--repeats``, one thread):

- quantized, a run per message (what the platform does), and float the same way;
- each window of ``--batch`` messages in arrival order (as a micro-batcher of concurrent requests
  would collect them) in one run, padded to its longest message;
- the same windows in the runs ``chat.encoder.batches`` chooses for their lengths (similar lengths
  together: the best a micro-batcher could do with them);
- for the quantized windows in one run, how far each embedding then moves from the same message's
  alone (cosine): what batching the quantized model would cost in reproducibility.
"""

from __future__ import annotations

import argparse
import json
import time

import numpy as np
from common import ROOT  # before chat: sets the environment and sys.path

from chat.encoder import TUNED_PATH, Encoder, batches, model_dir


def per_message_ms(encoder: Encoder, framed: list[list[int]], batch: int, repeats: int,
                   by_length: bool = False) -> tuple[float, np.ndarray]:
    """CPU ms per message encoding ``framed`` in windows of ``batch`` in arrival order, each window
    in one run, or (``by_length``) in the runs ``chat.encoder.batches`` chooses for the window's
    lengths (best of ``repeats``), and the embeddings."""
    best, out = float("inf"), np.zeros((len(framed), encoder.hidden), dtype=np.float32)
    for _ in range(repeats):
        began = time.process_time()
        for start in range(0, len(framed), batch):
            window = list(range(start, min(start + batch, len(framed))))
            runs = ([[window[i] for i in run] for run in batches([len(framed[i]) for i in window])]
                    if by_length else [window])
            for run in runs:
                out[run] = encoder._run([framed[i] for i in run])
        best = min(best, time.process_time() - began)
    return 1000 * best / len(framed), out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--messages", type=int, default=96)
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    path = ROOT / "chat" / "crisis_data" / "heldout" / "round11.jsonl"
    texts = [json.loads(line)["text"] for line in path.read_text(encoding="utf-8").splitlines()[: args.messages]]
    quantized = Encoder(model_dir(), TUNED_PATH, quantized=True)
    floating = Encoder(model_dir(), TUNED_PATH)
    framed = [quantized.token_ids(t) for t in texts]
    lengths = [len(f) for f in framed]
    print(f"{len(texts)} messages of round 11, tokens median {int(np.median(lengths))}, max {max(lengths)}; "
          f"runs of {args.batch} in arrival order; CPU ms per message, best of {args.repeats}, one thread")
    q1, alone = per_message_ms(quantized, framed, 1, args.repeats)
    f1, _ = per_message_ms(floating, framed, 1, args.repeats)
    fb, _ = per_message_ms(floating, framed, args.batch, args.repeats)
    fl, _ = per_message_ms(floating, framed, args.batch, args.repeats, by_length=True)
    qb, together = per_message_ms(quantized, framed, args.batch, args.repeats)
    ql, _ = per_message_ms(quantized, framed, args.batch, args.repeats, by_length=True)
    cosine = (alone * together).sum(axis=1)
    print("| encoder | a run per message | the window in one run | the window in runs by length |\n|---|---|---|---|")
    print(f"| quantized (the platform's) | {q1:.2f} | {qb:.2f} ({qb / q1:.2f}x) | {ql:.2f} ({ql / q1:.2f}x) |")
    print(f"| float | {f1:.2f} | {fb:.2f} ({fb / f1:.2f}x) | {fl:.2f} ({fl / f1:.2f}x) |")
    print(f"\nthe best float batching against the platform's quantized runs: {min(fb, fl) / q1:.2f}x the CPU")
    print(f"quantized batched against alone, cosine of each message's embedding: min {cosine.min():.4f}, "
          f"median {np.median(cosine):.4f} (1 would be independent of its companions)")


if __name__ == "__main__":
    main()
