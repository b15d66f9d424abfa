"""How far the quantized encoder's embeddings are from the float model's, per weight format.

    .venv/bin/python bench/quantization.py [--messages 80] [--tuned PATH]

On the first ``--messages`` of round 11 (held out, written independently), each message encoded
alone as the platform runs it: the cosine of each quantized embedding with the float model's (same
tuned layers), and the CPU seconds to encode them (best of three). Formats: the platform's
(``chat.encoder.quantize``: signed 8-bit weights, a scale per output column), 7-bit weights
(``reduce_range``: no processor's integer kernels saturate on them) and unsigned 8-bit weights.
``--tuned``: another file of tuned layers (e.g. an earlier commit's, from ``git show``) instead of
``chat/crisis_data/encoder_tuned.safetensors``. Prints the processor's name and whether it has VNNI.
"""

from __future__ import annotations

import argparse
import json
import logging
import tempfile
import time
from pathlib import Path

import numpy as np
from common import ROOT  # before chat: sets the environment and sys.path
from onnxruntime.quantization import QuantType, quantize_dynamic

import chat.encoder as encoder_module
from chat.encoder import TUNED_PATH, Encoder, model_dir

FORMATS = {"int8 (the platform's)": {"weight_type": QuantType.QInt8},
           "int8, 7-bit (reduce_range)": {"weight_type": QuantType.QInt8, "reduce_range": True},
           "uint8": {"weight_type": QuantType.QUInt8}}


def quantizer(options: dict[str, object]):  # type: ignore[no-untyped-def]
    def quantize(graph: bytes) -> bytes:
        with tempfile.TemporaryDirectory() as folder:
            source, target = Path(folder) / "float.onnx", Path(folder) / "int8.onnx"
            source.write_bytes(graph)
            quantize_dynamic(source, target, per_channel=True, **options)  # type: ignore[arg-type]
            return target.read_bytes()
    return quantize


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--messages", type=int, default=80)
    parser.add_argument("--tuned", type=Path, default=TUNED_PATH)
    args = parser.parse_args()
    logging.getLogger().setLevel(logging.ERROR)
    lines = (ROOT / "chat/crisis_data/heldout/round11.jsonl").read_text(encoding="utf-8").splitlines()
    texts = [json.loads(line)["text"] for line in lines if line.strip()][: args.messages]
    cpu = Path("/proc/cpuinfo").read_text() if Path("/proc/cpuinfo").exists() else ""
    name = next((line.split(":", 1)[1].strip() for line in cpu.splitlines() if line.startswith("model name")), "?")
    print(f"processor: {name}; VNNI: {'yes' if 'vnni' in cpu else 'no'}; tuned layers: {args.tuned}")
    reference = Encoder(model_dir(), args.tuned, quantized=False).encode(texts)
    for label, options in FORMATS.items():
        encoder_module.quantize = quantizer(options)  # the Encoder quantizes through this name
        quantized = Encoder(model_dir(), args.tuned, quantized=True)
        seconds = []
        for _ in range(3):
            began = time.process_time()
            embeddings = quantized.encode(texts)
            seconds.append(time.process_time() - began)
        cosine = (embeddings * reference).sum(axis=1)
        print(f"{label:<28} cosine min {cosine.min():.4f}  5th percentile {np.percentile(cosine, 5):.4f}  "
              f"median {np.median(cosine):.4f}  CPU {min(seconds):.2f} s for {len(texts)} messages")


if __name__ == "__main__":
    main()
