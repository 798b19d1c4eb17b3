#!/usr/bin/env python3
"""hf_writer.py — Hugging Face checkpoints written the way outside exporters write them.

Plain struct + json + numpy, not prl's code: safetensors files (header JSON padded to 8
bytes), shards with model.safetensors.index.json, BF16 / F16 / F32, and DeepSeek-V3's
F8_E4M3 with 128×128 block scales (`<name>_scale_inv`), no prl metadata. Tensor names and
shapes come from the reference (reference/pangu_ref.py), which never reads prl's code.

Used by tests/test_import.py (as a module) and tests/test_import_run.sh (as a command):
  hf_writer.py CONFIG.json OUT_DIR [--dtype BF16|F16|F32] [--shards N] [--fp8] [--seed S]
"""
import argparse
import json
import os
import struct
import sys

import numpy as np
import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "reference"))
from pangu_ref import PanguRef  # noqa: E402  (names and shapes only)


def bf16_bits(x):
    """float32 -> bfloat16 bits, round to nearest even."""
    u = np.asarray(x, np.float32).view(np.uint32).astype(np.uint64)
    return ((u + 0x7FFF + ((u >> 16) & 1)) >> 16).astype(np.uint16)


def bf16_value(bits):
    return (bits.astype(np.uint32) << 16).view(np.float32)


def e4m3_table():
    """Every float8 e4m3fn byte's value (NaN for 0x7f/0xff)."""
    vals = np.empty(256, np.float64)
    for b in range(256):
        e, m = (b >> 3) & 15, b & 7
        v = np.nan if (e == 15 and m == 7) else (m / 8 * 2.0**-6 if e == 0 else (1 + m / 8) * 2.0 ** (e - 7))
        vals[b] = -v if b & 0x80 else v
    return vals


E4M3 = e4m3_table()
E4M3_POS = np.array([b for b in range(128) if not np.isnan(E4M3[b])])  # 0..0x7e, ascending


def fp8_quantize(w, block=128):
    """DeepSeek-V3 block quantisation: per 128×128 block scale = amax/448, bytes = nearest
    e4m3 of w/scale. Returns (bytes uint8, scale_inv float32, dequantised float64)."""
    R, C = w.shape
    sr, sc = -(-R // block), -(-C // block)
    scale = np.zeros((sr, sc), np.float32)
    q = np.zeros((R, C), np.uint8)
    for i in range(sr):
        for j in range(sc):
            blk = w[i * block:(i + 1) * block, j * block:(j + 1) * block]
            s = np.float32(max(np.abs(blk).max(), 1e-12) / 448.0)
            scale[i, j] = s
            x = np.abs(blk / s)
            vals = E4M3[E4M3_POS]
            k = np.clip(np.searchsorted(vals, x), 1, len(vals) - 1)
            nearer = np.where(x - vals[k - 1] <= vals[k] - x, k - 1, k)
            byte = E4M3_POS[nearer].astype(np.uint8) | np.where(blk < 0, 0x80, 0).astype(np.uint8)
            q[i * block:(i + 1) * block, j * block:(j + 1) * block] = byte
    deq = E4M3[q] * np.kron(scale.astype(np.float64), np.ones((block, block)))[:R, :C]
    return q, scale, deq


def write_safetensors(path, tensors, metadata=None):
    """tensors: name -> (dtype string, shape, raw bytes). Header JSON padded to 8 bytes."""
    header, offset, blobs = {}, 0, []
    for name, (dtype, shape, raw) in tensors.items():
        header[name] = {"dtype": dtype, "shape": list(shape), "data_offsets": [offset, offset + len(raw)]}
        offset += len(raw)
        blobs.append(raw)
    if metadata:
        header["__metadata__"] = metadata
    text = json.dumps(header).encode()
    text += b" " * (-len(text) % 8)
    with open(path, "wb") as fh:
        fh.write(struct.pack("<Q", len(text)) + text + b"".join(blobs))


def write_checkpoint(d, config, arrays, dtype, shards=1, fp8=False):
    """arrays: name -> float64 values. Returns the values as stored (what a loader must see)."""
    os.makedirs(d)
    stored, entries = {}, {}
    for name, a in arrays.items():
        if fp8 and a.ndim == 2 and "weight" in name and "norm" not in name and "embed" not in name \
                and "head" not in name and ".gate." not in name:
            q, s, deq = fp8_quantize(a)
            entries[name] = ("F8_E4M3", a.shape, q.tobytes())
            entries[name + "_scale_inv"] = ("F32", s.shape, s.tobytes())
            stored[name] = deq
        elif dtype == "BF16":
            bits = bf16_bits(a)
            entries[name] = ("BF16", a.shape, bits.tobytes())
            stored[name] = bf16_value(bits).astype(np.float64)
        elif dtype == "F16":
            h = a.astype(np.float16)
            entries[name] = ("F16", a.shape, h.tobytes())
            stored[name] = h.astype(np.float64)
        else:
            f = a.astype(np.float32)
            entries[name] = ("F32", a.shape, f.tobytes())
            stored[name] = f.astype(np.float64)
    if fp8:
        config = dict(config, quantization_config={"activation_scheme": "dynamic", "fmt": "e4m3",
                                                   "quant_method": "fp8", "weight_block_size": [128, 128]})
    with open(os.path.join(d, "config.json"), "w") as fh:
        json.dump(config, fh, indent=2)
    names = list(entries)
    if shards == 1:
        write_safetensors(os.path.join(d, "model.safetensors"), entries, {"format": "pt"})
        return stored
    weight_map, total = {}, 0
    per = -(-len(names) // shards)
    for k in range(shards):
        fname = f"model-{k + 1:05d}-of-{shards:05d}.safetensors"
        part = {n: entries[n] for n in names[k * per:(k + 1) * per]}
        write_safetensors(os.path.join(d, fname), part, {"format": "pt"})
        for n, (_, _, raw) in part.items():
            weight_map[n] = fname
            total += len(raw)
    with open(os.path.join(d, "model.safetensors.index.json"), "w") as fh:
        json.dump({"metadata": {"total_size": total}, "weight_map": weight_map}, fh, indent=2)
    return stored


def with_mtp_copies(config, arrays):
    """DeepSeek-V3 files store the MTP layer's own copies of the embedding and the head."""
    L = config["num_hidden_layers"]
    for l in range(L, L + config.get("num_nextn_predict_layers", 0)):
        arrays.setdefault(f"model.layers.{l}.embed_tokens.weight", arrays["model.embed_tokens.weight"])
        arrays.setdefault(f"model.layers.{l}.shared_head.head.weight", arrays["lm_head.weight"])
    return arrays


def hf_name(name):
    """The reference names the selection bias e_score_correction.bias; HF files use this."""
    return name.replace("mlp.e_score_correction.bias", "mlp.gate.e_score_correction_bias")


def random_weights(config, seed):
    model = PanguRef(config, dtype=torch.float64)
    rng = np.random.default_rng(seed)
    arrays = {}
    for name, t in model.state_dict().items():
        shape = tuple(t.shape)
        if "norm" in name:
            a = 1 + 0.2 * rng.standard_normal(shape)
        elif "e_score_correction" in name:
            a = 0.05 * rng.standard_normal(shape)
        else:
            a = 0.08 * rng.standard_normal(shape)
        arrays[hf_name(name)] = a
    return arrays




def main():
    ap = argparse.ArgumentParser(description="write a random Hugging Face checkpoint")
    ap.add_argument("config")
    ap.add_argument("out")
    ap.add_argument("--dtype", default="BF16", choices=["BF16", "F16", "F32"])
    ap.add_argument("--shards", type=int, default=1)
    ap.add_argument("--fp8", action="store_true")
    ap.add_argument("--seed", type=int, default=1)
    a = ap.parse_args()
    config = json.load(open(a.config))
    write_checkpoint(a.out, config, with_mtp_copies(config, random_weights(config, a.seed)),
                     a.dtype, a.shards, a.fp8)
    return 0


if __name__ == "__main__":
    sys.exit(main())
