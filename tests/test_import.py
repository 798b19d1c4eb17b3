#!/usr/bin/env python3
"""test_import.py — prl loads Hugging Face checkpoints it did not write (openpangu_v2, deepseek_v3).

usage: /usr/bin/python3 tests/test_import.py PRL SRC_DIR

An independent writer (plain struct + json + numpy below, not prl's code and not the
reference's writer) lays out checkpoints as Hugging Face exporters do: sharded with
model.safetensors.index.json, BF16 or F16, DeepSeek-V3's F8_E4M3 with 128×128 block scales
(`weight_scale_inv`), no prl metadata. `prl score --logits` on each must equal the PyTorch
reference (reference/pangu_ref.py, float64, on the values the writer stored) within 1e-5
relative. Then every kind of bad file (truncated shard, index naming a missing shard,
overlapping offsets, wrong dtype, a NaN, a missing or extra tensor) must be refused with a
message naming the tensor or file, and nothing written.
"""
import json
import os
import struct
import subprocess
import sys
import tempfile

import numpy as np
import torch

PRL, SRC = sys.argv[1], sys.argv[2]
sys.path.insert(0, os.path.join(SRC, "reference"))
from pangu_ref import PanguRef  # noqa: E402  (the oracle)
sys.path.insert(0, os.path.join(SRC, "tests"))
from hf_writer import hf_name, random_weights, with_mtp_copies, write_checkpoint  # noqa: E402

FAILS = []


def check(ok, what):
    print(("ok   " if ok else "FAIL ") + what)
    if not ok:
        FAILS.append(what)


def read_raw(path):
    """name -> (dtype, shape, bytes) of a safetensors file."""
    with open(path, "rb") as fh:
        buf = fh.read()
    (n,) = struct.unpack("<Q", buf[:8])
    header = json.loads(buf[8:8 + n])
    return {name: (e["dtype"], tuple(e["shape"]), buf[8 + n + e["data_offsets"][0]:8 + n + e["data_offsets"][1]])
            for name, e in header.items() if name != "__metadata__"}


def read_safetensors(path):
    out = {}
    for name, (dtype, shape, raw) in read_raw(path).items():
        assert dtype == "F32"
        out[name] = np.frombuffer(raw, np.float32).reshape(shape)
    return out


def read_hf_dir(d):
    """Every tensor of an HF directory (single file or index + shards), checking the index."""
    idx = os.path.join(d, "model.safetensors.index.json")
    if not os.path.exists(idx):
        return read_raw(os.path.join(d, "model.safetensors"))
    index = json.load(open(idx))
    out = {}
    for f in sorted(set(index["weight_map"].values())):
        part = read_raw(os.path.join(d, f))
        assert all(index["weight_map"][n] == f for n in part), f"{f}: a tensor not mapped to it"
        out.update(part)
    assert set(out) == set(index["weight_map"]), "index and shards disagree"
    assert index["metadata"]["total_size"] == sum(len(r) for _, _, r in out.values())
    return out


# ------------------------------------------------------------------ models and weights
OPENPANGU = {
    "architectures": ["PanguV2ForCausalLM"], "model_type": "openpangu_v2", "torch_dtype": "bfloat16",
    "vocab_size": 320, "hidden_size": 192, "num_hidden_layers": 3, "num_attention_heads": 4,
    "q_lora_rank": 160, "kv_lora_rank": 136, "qk_nope_head_dim": 32, "qk_rope_head_dim": 16,
    "v_head_dim": 32, "rope_theta": 10000.0, "rms_norm_eps": 1e-5, "first_k_dense_replace": 1,
    "intermediate_size": 288, "n_routed_experts": 6, "num_experts_per_tok": 2,
    "moe_intermediate_size": 144, "n_shared_experts": 1, "norm_topk_prob": True,
    "routed_scaling_factor": 1.5, "max_position_embeddings": 64, "bos_token_id": 1,
    "eos_token_id": 2, "use_cache": True, "transformers_version": "4.48.0",
}


# DeepSeek-V3's maths at a size the test runs fast: grouped routing, YaRN, interleaved RoPE,
# moe_layer_freq 2, an MTP layer (its embed_tokens / shared_head.head copies written as
# DeepSeek ships them); hidden 192 so the 128×128 fp8 blocks have partial edges.
DEEPSEEK = {
    "architectures": ["DeepseekV3ForCausalLM"], "model_type": "deepseek_v3", "torch_dtype": "bfloat16",
    "vocab_size": 320, "hidden_size": 192, "num_hidden_layers": 4, "num_attention_heads": 4,
    "num_key_value_heads": 4, "q_lora_rank": 160, "kv_lora_rank": 136, "qk_nope_head_dim": 32,
    "qk_rope_head_dim": 16, "v_head_dim": 32, "rope_theta": 10000.0,
    "rope_scaling": {"type": "yarn", "factor": 4.0, "original_max_position_embeddings": 64,
                     "beta_fast": 32, "beta_slow": 1, "mscale": 1.0, "mscale_all_dim": 1.0},
    "rms_norm_eps": 1e-6, "first_k_dense_replace": 1, "moe_layer_freq": 2, "intermediate_size": 288,
    "n_routed_experts": 8, "n_group": 4, "topk_group": 2, "topk_method": "noaux_tc",
    "scoring_func": "sigmoid", "num_experts_per_tok": 3, "moe_intermediate_size": 144,
    "n_shared_experts": 1, "norm_topk_prob": True, "routed_scaling_factor": 2.5,
    "num_nextn_predict_layers": 1, "max_position_embeddings": 256, "tie_word_embeddings": False,
    "ep_size": 1, "aux_loss_alpha": 0.001, "seq_aux": True, "bos_token_id": 0, "eos_token_id": 1,
    "use_cache": True, "attention_bias": False, "attention_dropout": 0.0, "hidden_act": "silu",
    "initializer_range": 0.02, "transformers_version": "4.46.3",
}


def reference_logits(config, stored, sequences):
    model = PanguRef(config, dtype=torch.float64)
    sd = {n: torch.from_numpy(np.asarray(stored[hf_name(n)], np.float64)) for n in model.state_dict()}
    model.load_state_dict(sd)
    with torch.no_grad():
        return [model(torch.tensor([s])).logits[0].numpy() for s in sequences]


def sequences(vocab, seed):
    rng = np.random.default_rng(seed)
    return [rng.integers(3, vocab, size=n).tolist() for n in (17, 33, 9)]


def run(args, **kw):
    return subprocess.run([PRL] + args, capture_output=True, text=True, **kw)


def snapshot(d):
    return {f: (os.stat(os.path.join(d, f)).st_size, os.stat(os.path.join(d, f)).st_mtime_ns)
            for f in sorted(os.listdir(d))}


def score_logits(work, d, tag, seqs):
    inp = os.path.join(work, tag + ".jsonl")
    with open(inp, "w") as fh:
        for s in seqs:
            fh.write(json.dumps({"ids": s}) + "\n")
    out = os.path.join(work, tag + ".logits.safetensors")
    r = run(["score", "--ckpt", d, "--input", inp, "--logits", out])
    return (read_safetensors(out) if r.returncode == 0 else None), r


def exports(work):
    """prl export of an imported checkpoint: shards and index any HF reader takes, BF16 bytes
    equal to the imported ones, F32 scoring exactly as the source."""
    src = os.path.join(work, "openpangu-bf16-3shards")
    seqs = sequences(OPENPANGU["vocab_size"], 5)
    base, _ = score_logits(work, src, "export-src", seqs)
    bf, f32 = os.path.join(work, "hf-bf16"), os.path.join(work, "hf-f32")
    r = run(["export", "--ckpt", src, "--out", bf, "--shard-size", "400KB"])
    check(r.returncode == 0, f"prl export --dtype bf16: {r.stdout.strip() or r.stderr.strip()}")
    got, want = read_hf_dir(bf), read_hf_dir(src)
    n_shards = len([f for f in os.listdir(bf) if f.startswith("model-")])
    check(got == want and n_shards > 1,
          f"bf16 export: {n_shards} shards, index consistent, every tensor byte-identical to the import")
    cfg = json.load(open(os.path.join(bf, "config.json")))
    check(cfg.get("model_type") == "openpangu_v2" and cfg.get("torch_dtype") == "bfloat16",
          "bf16 export: config.json keeps model_type, torch_dtype bfloat16")
    r = run(["export", "--ckpt", src, "--out", f32, "--dtype", "f32"])
    logits, _ = score_logits(work, f32, "export-f32", seqs) if r.returncode == 0 else (None, None)
    check(logits is not None and all(np.array_equal(logits[k], base[k]) for k in base),
          "f32 export scores bitwise as its source")
    before = snapshot(bf)
    r = run(["export", "--ckpt", src, "--out", bf])
    check(r.returncode != 0 and "exists" in r.stderr and snapshot(bf) == before,
          f"export refuses an existing directory: {r.stderr.strip()!r}")


def deepseek_export(work):
    """A DeepSeek-V3 import exported again: its own config keys and every tensor byte-identical."""
    src, out = os.path.join(work, "deepseek-bf16-4shards"), os.path.join(work, "hf-deepseek")
    r = run(["export", "--ckpt", src, "--out", out, "--shard-size", "1MB"])
    ok = r.returncode == 0
    got, want = (read_hf_dir(out), read_hf_dir(src)) if ok else ({}, {})
    L = DEEPSEEK["num_hidden_layers"]
    copies = {f"model.layers.{L}.embed_tokens.weight", f"model.layers.{L}.shared_head.head.weight"}
    check(ok and got == {k: v for k, v in want.items() if k not in copies},
          "deepseek export: every tensor byte-identical to the import (the MTP copies prl shares left out)")
    cfg = json.load(open(os.path.join(out, "config.json"))) if ok else {}
    check(all(cfg.get(k) == v for k, v in DEEPSEEK.items()),
          "deepseek export: config.json has the original keys and values")


def score_matches(work, tag, config, dtype, shards, fp8):
    d = os.path.join(work, tag)
    stored = write_checkpoint(d, config, with_mtp_copies(config, random_weights(config, 11)), dtype,
                              shards, fp8)
    seqs = sequences(config["vocab_size"], 5)
    inp = os.path.join(work, tag + ".jsonl")
    with open(inp, "w") as fh:
        for s in seqs:
            fh.write(json.dumps({"ids": s}) + "\n")
    before = snapshot(d)
    out = os.path.join(work, tag + ".logits.safetensors")
    r = run(["score", "--ckpt", d, "--input", inp, "--logits", out])
    if r.returncode != 0:
        check(False, f"{tag}: prl score failed: {r.stderr.strip()}")
        return
    got = read_safetensors(out)
    ref = reference_logits(config, stored, seqs)
    worst = max(np.abs(got[f"line.{i + 1}"] - ref[i]).max() / np.abs(ref[i]).max() for i in range(len(seqs)))
    check(worst < 1e-5, f"{tag}: prl score logits vs reference: max rel err {worst:.2e} (< 1e-5)")
    check(snapshot(d) == before, f"{tag}: the imported checkpoint is left as it was")


# ------------------------------------------------------------------ bad files
def refused(work, tag, mutate, expect, drop=None):
    """Write a good 2-shard BF16 checkpoint (without tensor `drop`), break it, and require a
    clean refusal."""
    d = os.path.join(work, "bad-" + tag)
    arrays = random_weights(OPENPANGU, 3)
    arrays.pop(drop, None)
    write_checkpoint(d, OPENPANGU, arrays, "BF16", shards=2)
    mutate(d)
    before = snapshot(d)
    inp = os.path.join(work, "bad.jsonl")
    with open(inp, "w") as fh:
        fh.write(json.dumps({"ids": [5, 6, 7]}) + "\n")
    out = os.path.join(work, "bad-" + tag + ".logits")
    r = run(["score", "--ckpt", d, "--input", inp, "--logits", out])
    msg = r.stderr.strip().splitlines()[-1] if r.stderr.strip() else ""
    check(r.returncode != 0 and expect in msg and not os.path.exists(out) and snapshot(d) == before,
          f"refuses {tag}: {msg!r}")


def shard(d, k=1):
    return os.path.join(d, f"model-{k:05d}-of-00002.safetensors")


def edit_index(d, fn):
    p = os.path.join(d, "model.safetensors.index.json")
    idx = json.load(open(p))
    fn(idx)
    json.dump(idx, open(p, "w"))


def edit_header(path, fn):
    buf = open(path, "rb").read()
    (n,) = struct.unpack("<Q", buf[:8])
    header = json.loads(buf[8:8 + n])
    fn(header)
    text = json.dumps(header).encode()
    text += b" " * (-len(text) % 8)
    open(path, "wb").write(struct.pack("<Q", len(text)) + text + buf[8 + n:])


def first_tensor(header):
    return next(k for k in header if k != "__metadata__")


def truncate(d):
    p = shard(d, 2)
    os.truncate(p, os.path.getsize(p) - 100)


def missing_shard(d):
    edit_index(d, lambda idx: idx["weight_map"].update({k: "model-00009-of-00002.safetensors"
                                                        for k in list(idx["weight_map"])[:1]}))


def overlap(d):
    def fn(h):
        names = [k for k in h if k != "__metadata__"]
        a, b = h[names[1]]["data_offsets"]
        h[names[1]]["data_offsets"] = [a - 2, b - 2]
    edit_header(shard(d), fn)


def wrong_dtype(d):
    edit_header(shard(d), lambda h: h[first_tensor(h)].update(dtype="I16"))


def nan(d):
    p = shard(d)
    buf = bytearray(open(p, "rb").read())
    (n,) = struct.unpack("<Q", buf[:8])
    h = json.loads(buf[8:8 + n])
    a = h[first_tensor(h)]["data_offsets"][0]
    buf[8 + n + a:8 + n + a + 2] = struct.pack("<H", 0x7FC0)  # a bf16 NaN
    open(p, "wb").write(bytes(buf))


def extra(d):
    def fn(idx):
        idx["weight_map"]["model.layers.0.mlp.bogus.weight"] = "model-00001-of-00002.safetensors"
    # an extra tensor must be both in a shard and in the index to get past the index checks
    p = shard(d)
    buf = open(p, "rb").read()
    (n,) = struct.unpack("<Q", buf[:8])
    h = json.loads(buf[8:8 + n])
    end = max(v["data_offsets"][1] for k, v in h.items() if k != "__metadata__")
    h["model.layers.0.mlp.bogus.weight"] = {"dtype": "BF16", "shape": [2], "data_offsets": [end, end + 4]}
    text = json.dumps(h).encode()
    text += b" " * (-len(text) % 8)
    open(p, "wb").write(struct.pack("<Q", len(text)) + text + buf[8 + n:] + b"\0\0\0\0")
    edit_index(d, fn)


def main():
    with tempfile.TemporaryDirectory() as work:
        score_matches(work, "openpangu-bf16-3shards", OPENPANGU, "BF16", 3, False)
        score_matches(work, "openpangu-f16-single", OPENPANGU, "F16", 1, False)
        score_matches(work, "openpangu-fp8-2shards", OPENPANGU, "BF16", 2, True)
        score_matches(work, "deepseek-bf16-4shards", DEEPSEEK, "BF16", 4, False)
        score_matches(work, "deepseek-fp8-3shards", DEEPSEEK, "BF16", 3, True)
        exports(work)
        deepseek_export(work)
        refused(work, "a truncated shard", truncate, "model-00002-of-00002.safetensors")
        refused(work, "an index naming a missing shard", missing_shard, "model-00009-of-00002.safetensors")
        refused(work, "overlapping offsets", overlap, "model-00001-of-00002.safetensors")
        refused(work, "a wrong dtype", wrong_dtype, "I16")
        refused(work, "a NaN", nan, "NaN")
        refused(work, "an extra tensor", extra, "model.layers.0.mlp.bogus.weight")
        gone = "model.layers.1.mlp.experts.3.up_proj.weight"
        refused(work, "a missing tensor", lambda d: None, gone, drop=gone)
    print(f"{len(FAILS)} failed" if FAILS else "all import checks passed")
    return 1 if FAILS else 0


if __name__ == "__main__":
    sys.exit(main())
