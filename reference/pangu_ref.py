#!/usr/bin/env python3
"""Independent PyTorch reference of the model prl trains (the oracle for prl's C engine).

The maths follows ``docs/model.md`` to the letter; that page is the contract.  This file does
not read or depend on prl's C code.  It holds

* a pure Python + numpy safetensors reader/writer (``read_safetensors``, ``write_safetensors``);
* ``PanguRef(config)``: an ``nn.Module`` with the checkpoint's tensor names (MLA naive form with
  half-split RoPE, sliding windows, parameter sinks, ModAttn convs, DSA (lightning indexer,
  top-k selection, the indexer's KL loss with detached input; full-sequence forward only),
  dense SwiGLU, sigmoid-routed MoE with shared experts), its loss API
  (``compute_loss``: ``sum w*logp`` plus the balance and router z auxiliary losses) and the
  selection-bias update rules;
* KV-cached batched generation (``generate``: left-padded prefill, then one token per step,
  with the MLA cache in naive or absorbed form);
* a CLI: ``compare``, ``forward``, ``bench``, ``bench-decode``, ``generate`` and the helpers
  ``init`` and ``make-batch`` (see ``reference/README.md``).

Always run it with Debian's Python (``/usr/bin/python3``), which has torch.

One file, longer than ~800 lines, on purpose: an oracle anyone can read top to bottom and run
with ``python3`` alone, importing nothing of prl's.
"""

from __future__ import annotations

import argparse
import ctypes
import json
import math
import os
import statistics
import sys
import time

# Benchmark hygiene for `bench`, which must precede `import torch` (libgomp and OpenBLAS read
# their environment when loaded): torch's OpenMP pool and OpenBLAS's own pthread pool share the
# cores, and spin-waiting workers of one pool starve the other (several-fold slowdowns on a
# 2-core machine).  Passive waiting is the standard setting for that mix; a caller's own
# setting wins.
_BENCH_ENV_DEFAULTS = {"OMP_WAIT_POLICY": "PASSIVE"}
if __name__ == "__main__" and len(sys.argv) > 1 and sys.argv[1] in ("bench", "bench-decode"):
    for _k, _v in _BENCH_ENV_DEFAULTS.items():
        os.environ.setdefault(_k, _v)
from dataclasses import dataclass, field, replace
from typing import Dict, List, Mapping, Optional, Sequence, Tuple, Union

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F

__all__ = [
    "SafetensorsError", "read_safetensors", "write_safetensors", "serialize_safetensors",
    "deserialize_safetensors", "UnsupportedConfigError", "parse_config", "PanguRef",
    "rope_cos_sin", "apply_rope", "stable_topk", "load_checkpoint", "save_checkpoint",
    "load_batch", "run_reference", "compare_outputs", "KVCache", "MLA_FORMS", "left_pad",
    "prefill", "choose_tokens", "Generation", "generate",
]

# =============================================================================================
# safetensors (pure Python + numpy)
# =============================================================================================

MAX_HEADER_SIZE = 100_000_000

# Increasing alignment order, as in the reference implementation's Dtype enum; the writer sorts
# tensors by this order descending, then by name.
_ST_ORDER = ["BOOL", "U8", "I8", "F8_E5M2", "F8_E4M3", "I16", "U16", "F16", "BF16", "I32",
             "U32", "F32", "F64", "I64", "U64"]
_ST_RANK = {name: i for i, name in enumerate(_ST_ORDER)}
_ST_SIZE = {"BOOL": 1, "U8": 1, "I8": 1, "F8_E5M2": 1, "F8_E4M3": 1, "I16": 2, "U16": 2,
            "F16": 2, "BF16": 2, "I32": 4, "U32": 4, "F32": 4, "F64": 8, "I64": 8, "U64": 8}
# numpy storage dtype of each safetensors dtype (BF16 is stored as raw uint16 bits).
_ST_NP = {"BOOL": np.dtype(np.bool_), "U8": np.dtype("u1"), "I8": np.dtype("i1"),
          "I16": np.dtype("<i2"), "U16": np.dtype("<u2"), "F16": np.dtype("<f2"),
          "BF16": np.dtype("<u2"), "I32": np.dtype("<i4"), "U32": np.dtype("<u4"),
          "F32": np.dtype("<f4"), "F64": np.dtype("<f8"), "I64": np.dtype("<i8"),
          "U64": np.dtype("<u8")}
_NP_ST = {np.dtype(np.bool_): "BOOL", np.dtype(np.uint8): "U8", np.dtype(np.int8): "I8",
          np.dtype(np.int16): "I16", np.dtype(np.uint16): "U16", np.dtype(np.float16): "F16",
          np.dtype(np.int32): "I32", np.dtype(np.uint32): "U32", np.dtype(np.float32): "F32",
          np.dtype(np.float64): "F64", np.dtype(np.int64): "I64", np.dtype(np.uint64): "U64"}


class SafetensorsError(ValueError):
    """A malformed safetensors file or an unwritable tensor."""


def bf16_bits_to_f32(bits: np.ndarray) -> np.ndarray:
    """Raw bfloat16 bits (uint16) -> float32 (exact)."""
    return (np.asarray(bits, dtype="<u2").astype("<u4") << np.uint32(16)).view("<f4")


def f32_to_bf16_bits(x: np.ndarray) -> np.ndarray:
    """float32 -> bfloat16 bits, round to nearest even; NaN stays a (quiet) NaN."""
    u = np.ascontiguousarray(np.asarray(x, dtype="<f4")).view("<u4").astype(np.uint64)
    rounded = ((u + np.uint64(0x7FFF) + ((u >> np.uint64(16)) & np.uint64(1))) >> np.uint64(16))
    out = (rounded & np.uint64(0xFFFF)).astype("<u2")
    nan = np.isnan(np.asarray(x, dtype="<f4"))
    if nan.any():
        out[nan] = ((u[nan] >> np.uint64(16)) | np.uint64(0x0040)).astype("<u2")
    return out


def _reject_duplicates(pairs):
    obj = {}
    for k, v in pairs:
        if k in obj:
            raise SafetensorsError(f"duplicate key {k!r} in safetensors header")
        obj[k] = v
    return obj


def deserialize_safetensors(buf, *, raw_bf16: bool = False, with_dtypes: bool = False):
    """Parse a whole safetensors byte buffer.

    Returns ``(tensors, metadata)`` (or ``(tensors, metadata, dtypes)`` with ``with_dtypes``):
    tensors is {name: numpy array} (BF16 is widened to float32 unless ``raw_bf16``, in which
    case the raw uint16 bits are returned), metadata is the ``__metadata__`` dict (or {}).
    The header is validated like the reference implementation does: the tensors' byte ranges,
    ordered by offset, must tile the data section exactly (no gap, no overlap, nothing left
    over), and each range must be exactly prod(shape) * itemsize bytes.
    """
    mv = memoryview(buf).cast("B")
    total = len(mv)
    if total < 8:
        raise SafetensorsError(f"file too small ({total} bytes) to hold the 8-byte header length")
    n = int.from_bytes(bytes(mv[:8]), "little")
    if n > MAX_HEADER_SIZE:
        raise SafetensorsError(f"header length {n} exceeds the {MAX_HEADER_SIZE}-byte limit")
    if 8 + n > total:
        raise SafetensorsError(f"header length {n} runs past the end of the file ({total} bytes)")
    try:
        text = bytes(mv[8:8 + n]).decode("utf-8")
    except UnicodeDecodeError as e:
        raise SafetensorsError(f"header is not valid UTF-8: {e}") from None
    try:
        header = json.loads(text, object_pairs_hook=_reject_duplicates)
    except json.JSONDecodeError as e:
        raise SafetensorsError(f"header is not valid JSON: {e}") from None
    if not isinstance(header, dict):
        raise SafetensorsError("header JSON is not an object")
    metadata = header.pop("__metadata__", None)
    if metadata is None:
        metadata = {}
    if not isinstance(metadata, dict) or not all(
            isinstance(k, str) and isinstance(v, str) for k, v in metadata.items()):
        raise SafetensorsError("__metadata__ must be an object mapping strings to strings")
    data_len = total - 8 - n
    entries = []
    for name, info in header.items():
        if not isinstance(info, dict):
            raise SafetensorsError(f"tensor {name!r}: entry is not an object")
        extra = set(info) - {"dtype", "shape", "data_offsets"}
        if extra or set(info) != {"dtype", "shape", "data_offsets"}:
            raise SafetensorsError(f"tensor {name!r}: expected keys dtype, shape, data_offsets; "
                                   f"got {sorted(info)}")
        dt, shape, offs = info["dtype"], info["shape"], info["data_offsets"]
        if dt not in _ST_NP:
            raise SafetensorsError(f"tensor {name!r}: unsupported dtype {dt!r}")
        if (not isinstance(shape, list) or
                not all(isinstance(s, int) and not isinstance(s, bool) and s >= 0 for s in shape)):
            raise SafetensorsError(f"tensor {name!r}: bad shape {shape!r}")
        if (not isinstance(offs, list) or len(offs) != 2 or
                not all(isinstance(o, int) and not isinstance(o, bool) and o >= 0 for o in offs)):
            raise SafetensorsError(f"tensor {name!r}: bad data_offsets {offs!r}")
        entries.append((offs[0], offs[1], name, dt, shape))
    entries.sort(key=lambda e: (e[0], e[1]))
    pos = 0
    for begin, end, name, dt, shape in entries:
        if begin != pos or end < begin:
            raise SafetensorsError(f"tensor {name!r}: data_offsets [{begin}, {end}] do not start "
                                   f"where the previous tensor ends ({pos})")
        nbytes = math.prod(shape) * _ST_SIZE[dt]
        if end - begin != nbytes:
            raise SafetensorsError(f"tensor {name!r}: {end - begin} bytes in data_offsets but "
                                   f"dtype {dt} x shape {shape} needs {nbytes}")
        if end > data_len:
            raise SafetensorsError(f"tensor {name!r}: data_offsets end {end} is past the data "
                                   f"section ({data_len} bytes)")
        pos = end
    if pos != data_len:
        raise SafetensorsError(f"tensors cover {pos} bytes but the data section has {data_len}")
    base = 8 + n
    tensors, dtypes = {}, {}
    for begin, end, name, dt, shape in entries:
        arr = np.frombuffer(mv[base + begin:base + end], dtype=_ST_NP[dt]).reshape(shape).copy()
        if dt == "BF16" and not raw_bf16:
            arr = bf16_bits_to_f32(arr).reshape(shape)
        tensors[name] = arr
        dtypes[name] = dt
    if with_dtypes:
        return tensors, metadata, dtypes
    return tensors, metadata


def read_safetensors(path: str, *, raw_bf16: bool = False, with_dtypes: bool = False):
    """Read a safetensors file; see ``deserialize_safetensors`` for the result."""
    with open(path, "rb") as fh:
        buf = fh.read()
    try:
        return deserialize_safetensors(buf, raw_bf16=raw_bf16, with_dtypes=with_dtypes)
    except SafetensorsError as e:
        raise SafetensorsError(f"{path}: {e}") from None


def _to_numpy(value) -> Tuple[np.ndarray, Optional[str]]:
    if isinstance(value, torch.Tensor):
        t = value.detach().cpu().contiguous()
        if t.dtype == torch.bfloat16:
            return t.float().numpy(), "BF16"
        return t.numpy(), None
    return np.asarray(value), None


def serialize_safetensors(tensors: Mapping[str, object],
                          metadata: Optional[Mapping[str, str]] = None,
                          dtypes: Optional[Mapping[str, str]] = None) -> bytes:
    """Serialize {name: numpy array | torch tensor} to safetensors bytes.

    ``dtypes`` optionally forces the stored dtype of some tensors (e.g. {"w": "BF16"}).
    Layout as the reference writer: tensors sorted by dtype alignment (largest first), then by
    name; compact JSON header with ``__metadata__`` first; header padded with spaces to a
    multiple of 8 bytes.
    """
    dtypes = dict(dtypes or {})
    prepared = []
    for name, value in tensors.items():
        if not isinstance(name, str) or name == "__metadata__":
            raise SafetensorsError(f"bad tensor name {name!r}")
        arr, dt = _to_numpy(value)
        want = dtypes.pop(name, None) or dt
        if want is None:
            key = np.dtype(arr.dtype.type)          # native byte order
            if key not in _NP_ST:
                raise SafetensorsError(f"tensor {name!r}: numpy dtype {arr.dtype} has no "
                                       "safetensors equivalent")
            want = _NP_ST[key]
        if want not in _ST_NP:
            raise SafetensorsError(f"tensor {name!r}: unsupported dtype {want!r}")
        if want == "BF16":
            data = f32_to_bf16_bits(arr.astype(np.float32))
        else:
            data = arr.astype(_ST_NP[want], copy=False)
        data = np.ascontiguousarray(data)
        prepared.append((name, want, list(arr.shape), data.tobytes()))
    if dtypes:
        raise SafetensorsError(f"dtypes given for unknown tensors: {sorted(dtypes)}")
    prepared.sort(key=lambda p: (-_ST_RANK[p[1]], p[0]))
    header: Dict[str, object] = {}
    if metadata:
        md = {}
        for k in sorted(metadata):
            v = metadata[k]
            if not isinstance(k, str) or not isinstance(v, str):
                raise SafetensorsError("metadata must map strings to strings")
            md[k] = v
        header["__metadata__"] = md
    offset = 0
    for name, dt, shape, data in prepared:
        header[name] = {"dtype": dt, "shape": shape, "data_offsets": [offset, offset + len(data)]}
        offset += len(data)
    hbytes = json.dumps(header, separators=(",", ":"), ensure_ascii=False).encode("utf-8")
    hbytes += b" " * ((8 - len(hbytes) % 8) % 8)
    return b"".join([len(hbytes).to_bytes(8, "little"), hbytes] + [p[3] for p in prepared])


def write_safetensors(path: str, tensors: Mapping[str, object],
                      metadata: Optional[Mapping[str, str]] = None,
                      dtypes: Optional[Mapping[str, str]] = None) -> None:
    """Write a safetensors file (atomically: temp file + rename)."""
    data = serialize_safetensors(tensors, metadata, dtypes)
    tmp = f"{path}.tmp.{os.getpid()}"
    with open(tmp, "wb") as fh:
        fh.write(data)
    os.replace(tmp, path)


# =============================================================================================
# Config
# =============================================================================================

class UnsupportedConfigError(ValueError):
    """The config asks for something docs/model.md says is not (yet) supported."""


# (key, predicate "this value turns the block on", block name)
_UNSUPPORTED_BLOCKS = [
    ("layer_types", lambda v: any(x != "full_attention" for x in (v or [])),
     "non-full attention layer types"),
]

_REQUIRED_INT = ["vocab_size", "hidden_size", "num_hidden_layers", "num_attention_heads",
                 "q_lora_rank", "kv_lora_rank", "qk_nope_head_dim", "qk_rope_head_dim",
                 "v_head_dim"]


@dataclass
class PanguConfig:
    vocab_size: int
    hidden_size: int
    num_hidden_layers: int
    num_attention_heads: int
    q_lora_rank: int
    kv_lora_rank: int
    qk_nope_head_dim: int
    qk_rope_head_dim: int
    v_head_dim: int
    rope_theta: float
    rms_norm_eps: float
    first_k_dense_replace: int = 0
    intermediate_size: int = 0
    n_routed_experts: int = 0
    num_experts_per_tok: int = 0
    moe_intermediate_size: int = 0
    n_shared_experts: int = 0
    norm_topk_prob: bool = True
    routed_scaling_factor: float = 1.0
    max_position_embeddings: Optional[int] = None
    initializer_range: float = 0.02
    balance_loss_alpha: float = 0.0
    router_z_loss_coef: float = 0.0
    bias_update_rate: float = 0.0
    windows: List[int] = field(default_factory=list)    # per layer: 0 = causal, W = SWA
    param_sink_number: int = 0
    param_sink_with_value: bool = True
    conv_kernel: int = 0                                # ModAttn conv kernel k (0 = off)
    dsa_layers: List[int] = field(default_factory=list)  # layers with a lightning indexer
    index_topk: int = 0
    index_n_heads: int = 0
    index_head_dim: int = 0
    dsa_sparse: bool = True                             # prl_dsa_stage "sparse" (else "dense")
    mhc_streams: int = 0                                # mHC residual streams n (0 = off)
    mhc_recur_norm: int = 20                            # Sinkhorn iterations
    mhc_use_gamma: bool = False                         # norm_gamma on the flattened streams
    sandwich_norm: bool = False                         # post-attention / post-MLP norms
    block_post: List[int] = field(default_factory=list)  # layers followed by the n·d norm
    mtp_layers: int = 0                                 # num_nextn_predict_layers D
    mtp_loss_weight: float = 0.3                        # prl_mtp_loss_weight λ
    mtp_head_norm: bool = True                          # own shared_head.norm (else model.norm)
    mtp_head: bool = False                              # own shared_head.head (else lm_head)
    # DeepSeek-V3 family (model_type deepseek_v3 / kimi_k2; docs/config.md)
    moe_layer_freq: int = 1                             # MoE iff l >= fkdr and l % freq == 0
    n_group: int = 1                                    # noaux_tc group-limited routing
    topk_group: int = 1
    rope_interleave: bool = False                       # rotate pairs (x[2i], x[2i+1])
    rope_scaling: Optional[dict] = None                 # YaRN parameters, or None
    ignored_keys: List[str] = field(default_factory=list)

    @property
    def n_dense(self) -> int:
        return min(self.first_k_dense_replace, self.num_hidden_layers)

    def is_moe_layer(self, layer: int) -> bool:
        # modeling_deepseek.py's rule (DeepSeek's Hugging Face code)
        return layer >= self.first_k_dense_replace and layer % self.moe_layer_freq == 0

    def softmax_scale(self) -> float:
        """transformers' DeepseekV3Attention.scaling: qk_head_dim^-0.5 times
        yarn_get_mscale(factor, mscale_all_dim)^2 when mscale_all_dim is set."""
        scale = (self.qk_nope_head_dim + self.qk_rope_head_dim) ** -0.5
        rs = self.rope_scaling
        if rs and rs.get("mscale_all_dim"):
            m = _yarn_get_mscale(rs["factor"], rs["mscale_all_dim"])
            scale = scale * m * m
        return scale


def _yarn_get_mscale(scale: float, mscale: float = 1.0) -> float:
    return 1.0 if scale <= 1 else 0.1 * mscale * math.log(scale) + 1.0


_YARN_KEYS = {"type", "rope_type", "factor", "original_max_position_embeddings", "beta_fast",
              "beta_slow", "mscale", "mscale_all_dim", "attention_factor"}


def _parse_deepseek(cfg: Mapping[str, object], c: "PanguConfig") -> None:
    """The DeepSeek-V3 keys with maths (model_type, groups, moe_layer_freq, RoPE)."""
    mt = cfg.get("model_type", "openpangu_v2")
    if mt not in ("openpangu_v2", "deepseek_v3", "kimi_k2"):
        raise UnsupportedConfigError(f"config key 'model_type' = {mt!r} is not supported")
    if mt != "openpangu_v2" and cfg.get("topk_method", "noaux_tc") != "noaux_tc":
        raise UnsupportedConfigError(f"config key 'topk_method' = {cfg['topk_method']!r}: only "
                                     "'noaux_tc' is supported")
    if cfg.get("scoring_func", "sigmoid") != "sigmoid":
        raise UnsupportedConfigError(f"config key 'scoring_func' = {cfg['scoring_func']!r}: only "
                                     "'sigmoid' is supported")
    c.moe_layer_freq = int(cfg.get("moe_layer_freq") or 1)
    c.n_group = int(cfg.get("n_group") or 1)
    c.topk_group = int(cfg.get("topk_group") or 1)
    if c.n_group > 1 and (c.n_routed_experts % c.n_group or c.topk_group > c.n_group):
        raise ValueError("config keys 'n_group' / 'topk_group' do not divide the experts")
    # transformers' DeepseekV3Config defaults to interleaved pairs (DeepSeek's weight layout)
    c.rope_interleave = bool(cfg.get("rope_interleave", mt != "openpangu_v2"))
    rs = cfg.get("rope_scaling")
    if rs is not None:
        kind = rs.get("rope_type", rs.get("type"))
        if kind != "yarn":
            raise UnsupportedConfigError(f"config key 'rope_scaling' type {kind!r}: only 'yarn'")
        unknown = set(rs) - _YARN_KEYS
        if unknown:
            raise ValueError(f"config key 'rope_scaling': unknown keys {sorted(unknown)}")
        c.rope_scaling = dict(rs)
    kv = cfg.get("num_key_value_heads")
    if kv is not None and kv != c.num_attention_heads:
        raise ValueError("config key 'num_key_value_heads' must equal 'num_attention_heads'")


def _parse_windows(cfg: Mapping[str, object], n_layers: int) -> List[int]:
    """Per-layer attention window: layer swa_layers[i] slides with sliding_window_list[i] if
    the list is given, else sliding_window; every other layer is fully causal."""
    layers = cfg.get("swa_layers") or []
    wins = cfg.get("sliding_window_list") or []
    if wins and len(wins) != len(layers):
        raise ValueError("config key 'sliding_window_list' must have one entry per 'swa_layers'")
    windows = [0] * n_layers
    for i, l in enumerate(layers):
        if not isinstance(l, int) or not 0 <= l < n_layers or windows[l]:
            raise ValueError(f"config key 'swa_layers': bad or repeated layer {l!r}")
        w = wins[i] if wins else cfg.get("sliding_window") or 0
        if not isinstance(w, int) or w < 1:
            raise ValueError(f"config key 'swa_layers': layer {l} has window {w!r} (needs >= 1)")
        windows[l] = w
    return windows


def parse_config(cfg: Mapping[str, object]) -> PanguConfig:
    """Validate a config.json dict; raise UnsupportedConfigError naming the offending key."""
    if not isinstance(cfg, Mapping):
        raise ValueError("config must be a JSON object")
    for key, on, what in _UNSUPPORTED_BLOCKS:
        if key in cfg and on(cfg[key]):
            raise UnsupportedConfigError(
                f"config key '{key}' = {cfg[key]!r} turns on {what}, which is not supported "
                "(docs/model.md)")
    if cfg.get("tie_word_embeddings", False):
        raise UnsupportedConfigError("config key 'tie_word_embeddings' must be false")

    def get_int(key, default=None, minimum=0):
        if key not in cfg or cfg[key] is None:
            if default is None:
                raise ValueError(f"config key '{key}' is required")
            return default
        v = cfg[key]
        if isinstance(v, bool) or not isinstance(v, int) or v < minimum:
            raise ValueError(f"config key '{key}' = {v!r}: expected an integer >= {minimum}")
        return v

    def get_float(key, default=None):
        if key not in cfg or cfg[key] is None:
            if default is None:
                raise ValueError(f"config key '{key}' is required")
            return float(default)
        v = cfg[key]
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v):
            raise ValueError(f"config key '{key}' = {v!r}: expected a finite number")
        return float(v)

    ints = {k: get_int(k, minimum=1) for k in _REQUIRED_INT if k != "q_lora_rank"}
    if "q_lora_rank" in cfg and cfg["q_lora_rank"] is None:
        ints["q_lora_rank"] = 0          # no query latent: a direct q_proj
    else:
        ints["q_lora_rank"] = get_int("q_lora_rank", minimum=1)
    if ints["qk_rope_head_dim"] % 2:
        raise ValueError("config key 'qk_rope_head_dim' must be even (half-split RoPE)")
    c = PanguConfig(
        **ints,
        rope_theta=get_float("rope_theta"),
        rms_norm_eps=get_float("rms_norm_eps"),
        first_k_dense_replace=get_int("first_k_dense_replace", 0),
        norm_topk_prob=bool(cfg.get("norm_topk_prob", True)),
        routed_scaling_factor=get_float("routed_scaling_factor", 1.0),
        max_position_embeddings=(None if cfg.get("max_position_embeddings") is None
                                 else get_int("max_position_embeddings", minimum=1)),
        initializer_range=get_float("initializer_range", 0.02),
        balance_loss_alpha=get_float("prl_balance_loss_alpha", 0.0),
        router_z_loss_coef=get_float("prl_router_z_loss_coef", 0.0),
        bias_update_rate=get_float("prl_bias_update_rate", 0.0),
    )
    c.moe_layer_freq = get_int("moe_layer_freq", 1, minimum=1)
    c.mtp_layers = get_int("num_nextn_predict_layers", 0)
    c.mtp_loss_weight = get_float("prl_mtp_loss_weight", 0.3)
    c.mtp_head_norm = bool(cfg.get("prl_mtp_head_norm", True))
    c.mtp_head = bool(cfg.get("prl_mtp_head", False))
    c.windows = _parse_windows(cfg, c.num_hidden_layers + c.mtp_layers)  # MTP layers may slide
    c.param_sink_number = get_int("param_sink_number", 0)
    c.param_sink_with_value = bool(cfg.get("param_sink_with_value", True))
    k = get_int("router_sliding_window", 0)
    if cfg.get("use_mome", k > 0):        # use_mome defaults to router_sliding_window > 0
        if k < 1:
            raise ValueError("config key 'use_mome' is true but 'router_sliding_window' is 0")
        c.conv_kernel = k
    dsa = cfg.get("dsa_layers") or []
    if dsa:
        if not all(isinstance(l, int) and 0 <= l < c.num_hidden_layers and not c.windows[l]
                   for l in dsa) or len(set(dsa)) != len(dsa):
            raise ValueError(f"config key 'dsa_layers' = {dsa!r}: layers must be distinct, in "
                             "range and not in 'swa_layers'")
        c.dsa_layers = list(dsa)
        c.index_topk = get_int("index_topk", minimum=1)
        c.index_n_heads = get_int("index_n_heads", minimum=1)
        c.index_head_dim = get_int("index_head_dim", minimum=c.qk_rope_head_dim)
        stage = cfg.get("prl_dsa_stage", "sparse")
        if stage not in ("sparse", "dense"):
            raise ValueError(f"config key 'prl_dsa_stage' = {stage!r}: sparse | dense")
        c.dsa_sparse = stage == "sparse"
    if cfg.get("use_mhc", False):
        c.mhc_streams = get_int("mhc_num_stream", 4, minimum=1)
        c.mhc_recur_norm = get_int("mhc_recur_norm", 20, minimum=1)
        c.mhc_use_gamma = bool(cfg.get("mhc_use_gamma", False))
    c.sandwich_norm = bool(cfg.get("sandwich_norm", False))
    c.block_post = list(cfg.get("block_post_layernorm_idx") or [])
    if any(not isinstance(l, int) or not 0 <= l < c.num_hidden_layers for l in c.block_post) \
            or len(set(c.block_post)) != len(c.block_post):
        raise ValueError("config key 'block_post_layernorm_idx': bad or repeated layer")
    if c.rope_theta <= 0 or c.rms_norm_eps <= 0:
        raise ValueError("config keys 'rope_theta' and 'rms_norm_eps' must be > 0")
    all_layers = range(c.num_hidden_layers + c.mtp_layers)
    if not all(c.is_moe_layer(l) for l in all_layers):
        c.intermediate_size = get_int("intermediate_size", minimum=1)
    if any(c.is_moe_layer(l) for l in all_layers):
        c.n_routed_experts = get_int("n_routed_experts", minimum=1)
        c.num_experts_per_tok = get_int("num_experts_per_tok", minimum=1)
        c.moe_intermediate_size = get_int("moe_intermediate_size", minimum=1)
        c.n_shared_experts = get_int("n_shared_experts", 0)
        if c.num_experts_per_tok > c.n_routed_experts:
            raise ValueError("config key 'num_experts_per_tok' exceeds 'n_routed_experts'")
    known = set(_REQUIRED_INT) | {
        "rope_theta", "rope_interleave", "rms_norm_eps", "first_k_dense_replace",
        "intermediate_size", "n_routed_experts", "num_experts_per_tok", "moe_intermediate_size",
        "n_shared_experts", "norm_topk_prob", "routed_scaling_factor", "max_position_embeddings",
        "tie_word_embeddings", "initializer_range", "prl_balance_loss_alpha",
        "prl_router_z_loss_coef", "prl_bias_update_rate", "swa_layers", "sliding_window_list",
        "sliding_window", "param_sink_number", "param_sink_with_value", "use_mome",
        "router_sliding_window", "use_mhc", "mhc_num_stream", "mhc_recur_norm", "mhc_use_gamma",
        "sandwich_norm", "block_post_layernorm_idx", "num_nextn_predict_layers",
        "prl_mtp_loss_weight", "prl_mtp_head_norm", "prl_mtp_head", "dsa_layers", "index_topk",
        "index_n_heads", "index_head_dim", "prl_dsa_stage", "prl_dsa_freeze_main",
        "prl_mtp_freeze_trunk", "model_type", "moe_layer_freq", "n_group", "topk_group",
        "topk_method", "scoring_func", "rope_scaling", "num_key_value_heads"}
    _parse_deepseek(cfg, c)
    c.ignored_keys = sorted(k for k in cfg if k not in known)
    return c


# =============================================================================================
# Model
# =============================================================================================

def rope_cos_sin(positions: int, rope_dim: int, theta: float, dtype: torch.dtype,
                 device=None) -> Tuple[torch.Tensor, torch.Tensor]:
    """cos/sin tables [positions, rope_dim/2] for half-split RoPE.

    Pair i (x_i, x_{i+d_r/2}) turns by angle pos * theta^(-2i/d_r); the angle, its cosine and
    sine are computed in float64 and rounded once to ``dtype``.
    """
    half = rope_dim // 2
    inv_freq = torch.tensor([theta ** (-2.0 * i / rope_dim) for i in range(half)],
                            dtype=torch.float64)
    pos = torch.arange(positions, dtype=torch.float64)
    angle = pos[:, None] * inv_freq[None, :]
    return (torch.cos(angle).to(dtype=dtype, device=device),
            torch.sin(angle).to(dtype=dtype, device=device))


def yarn_inv_freq(rope_dim: int, theta: float, rs: Mapping[str, object]) -> torch.Tensor:
    """YaRN inverse frequencies (transformers' _compute_yarn_parameters, truncate=True), in
    float64: each pair blends 1/(factor*theta^(2i/d)) and 1/theta^(2i/d) by a linear ramp
    between the dimensions that turn beta_fast and beta_slow times over the original context."""
    factor = float(rs["factor"])
    orig = float(rs["original_max_position_embeddings"])
    beta_fast, beta_slow = float(rs.get("beta_fast") or 32), float(rs.get("beta_slow") or 1)

    def corr_dim(rot):
        return rope_dim * math.log(orig / (rot * 2 * math.pi)) / (2 * math.log(theta))

    low = max(math.floor(corr_dim(beta_fast)), 0)
    high = min(math.ceil(corr_dim(beta_slow)), rope_dim - 1)
    if low == high:
        high += 0.001
    i = torch.arange(rope_dim // 2, dtype=torch.float64)
    ramp = ((i - low) / (high - low)).clamp(0, 1)
    extrapolation = 1 - ramp
    pos_freqs = theta ** (2 * i / rope_dim)
    return 1 / (factor * pos_freqs) * (1 - extrapolation) + 1 / pos_freqs * extrapolation


def yarn_attention_factor(rs: Optional[Mapping[str, object]]) -> float:
    """The factor YaRN puts on cos and sin (transformers' attention_scaling)."""
    if not rs:
        return 1.0
    if rs.get("attention_factor") is not None:
        return float(rs["attention_factor"])
    factor, m, m_all = float(rs["factor"]), rs.get("mscale"), rs.get("mscale_all_dim")
    if m and m_all:
        return _yarn_get_mscale(factor, m) / _yarn_get_mscale(factor, m_all)
    return _yarn_get_mscale(factor)


def rope_cos_sin_scaled(positions: int, rope_dim: int, theta: float,
                        rope_scaling: Optional[Mapping[str, object]], dtype: torch.dtype,
                        device=None) -> Tuple[torch.Tensor, torch.Tensor]:
    """rope_cos_sin, or with YaRN: its frequencies and cos, sin times the attention factor."""
    if not rope_scaling:
        return rope_cos_sin(positions, rope_dim, theta, dtype, device)
    angle = torch.arange(positions, dtype=torch.float64)[:, None] * \
        yarn_inv_freq(rope_dim, theta, rope_scaling)[None, :]
    af = yarn_attention_factor(rope_scaling)
    return ((torch.cos(angle) * af).to(dtype=dtype, device=device),
            (torch.sin(angle) * af).to(dtype=dtype, device=device))


def apply_rope_interleave(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Interleaved RoPE as transformers' deepseek_v3 applies it: de-interleave the pairs
    (x[2i], x[2i+1]) to [x_even | x_odd], then half-split RoPE.  The result is in the
    de-interleaved order; q and k both are, so q.k equals rotating the pairs in place."""
    d = x.shape[-1]
    x = x.reshape(*x.shape[:-1], d // 2, 2).transpose(-1, -2).reshape(*x.shape[:-1], d)
    return apply_rope(x, cos, sin)


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Half-split RoPE on the last dim of x; cos/sin broadcast against x[..., :d_r/2]."""
    half = x.shape[-1] // 2
    x1, x2 = x[..., :half], x[..., half:]
    return torch.cat([x1 * cos - x2 * sin, x2 * cos + x1 * sin], dim=-1)


def packed_rope(pos: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor
                ) -> Tuple[torch.Tensor, torch.Tensor, Tuple[torch.Tensor, torch.Tensor]]:
    """Packed rows (docs/model.md "Packed sequences"): pos [B,T] is each token's position in
    its own sequence (0 starts one, -1 is padding).  Returns cos/sin [B,T,d_r/2] at those
    positions (0 for padding) and the MLA's pack = (pos, seen): seen [B,T,T] is True where key
    s belongs to query t's sequence, s >= t - pos_t (a padding row sees only itself)."""
    T = pos.shape[1]
    t = torch.arange(T, device=pos.device)
    start = torch.where(pos >= 0, t[None, :] - pos, t[None, :].expand_as(pos))
    seen = t[None, None, :] >= start[..., None]
    at = pos.clamp(min=0)
    return cos[at], sin[at], (pos, seen)


def sequence_ids(pos: torch.Tensor, valid: torch.Tensor) -> torch.Tensor:
    """[B,T] long: the index of each valid position's sequence in row-major order (a sequence
    starts at pos 0), -1 elsewhere."""
    starts = ((pos == 0) & valid).reshape(-1).long()
    ids = (starts.cumsum(0) - 1).view_as(pos)
    return torch.where(valid, ids, torch.full_like(ids, -1))


def stable_topk(scores: torch.Tensor, k: int) -> torch.Tensor:
    """Indices of the k largest entries along the last dim, ordered by rank; among equal
    values the lower index wins (a stable sort on -score)."""
    return torch.sort(-scores, dim=-1, stable=True).indices[..., :k]


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.weight * (x / torch.sqrt(x.pow(2).mean(-1, keepdim=True) + self.eps))


class SwiGLU(nn.Module):
    """(silu(x W_gate^T) * (x W_up^T)) W_down^T."""

    def __init__(self, dim: int, hidden: int):
        super().__init__()
        self.gate_proj = nn.Linear(dim, hidden, bias=False)
        self.up_proj = nn.Linear(dim, hidden, bias=False)
        self.down_proj = nn.Linear(hidden, dim, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class Indexer(nn.Module):
    """DSA lightning indexer (docs/model.md, DSA): H_I index heads of d_I dims read the normed
    compressed query cq, one key head reads the attention input x (k_norm: RMSNorm, eps 1e-6);
    the first d_r dims of every head and of the key rotate (half-split, the MLA's positions):
    I(t,s) = sum_j w(t,j) * ReLU(d_I^-1/2 q_j(t).k(s)), w = weights_proj(x) * H_I^-1/2."""

    def __init__(self, c: PanguConfig):
        super().__init__()
        self.HI, self.dI, self.dr, self.topk = (c.index_n_heads, c.index_head_dim,
                                                c.qk_rope_head_dim, c.index_topk)
        self.wq_b = nn.Linear(c.q_lora_rank, self.HI * self.dI, bias=False)
        self.wk = nn.Linear(c.hidden_size, self.dI, bias=False)
        self.k_norm = RMSNorm(self.dI, 1e-6)
        self.weights_proj = nn.Linear(c.hidden_size, self.HI, bias=False)

    def _rope(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        return torch.cat([apply_rope(x[..., :self.dr], cos, sin), x[..., self.dr:]], dim=-1)

    def scores(self, x: torch.Tensor, cq: torch.Tensor, cos: torch.Tensor,
               sin: torch.Tensor) -> torch.Tensor:
        """I [B, T, T] for x [B,T,d], cq [B,T,r_q] (the caller detaches both)."""
        B, T, _ = x.shape
        q = self._rope(self.wq_b(cq).view(B, T, self.HI, self.dI), cos.unsqueeze(-2),
                       sin.unsqueeze(-2))
        k = self._rope(self.k_norm(self.wk(x)), cos, sin)
        w = self.weights_proj(x) * self.HI ** -0.5
        a = torch.einsum("bthi,bsi->bths", q, k) * self.dI ** -0.5
        return (w[..., None] * F.relu(a)).sum(2)


def dsa_kl_rows(target: torch.Tensor, scores: torch.Tensor, support: torch.Tensor) -> torch.Tensor:
    """KL(p || softmax_S(I)) per query row [B, T]: p = target / sum_S target over the support S
    (bool [B,T,T]); 0 log 0 = 0."""
    p = torch.where(support, target, torch.zeros_like(target))
    p = p / p.sum(-1, keepdim=True).clamp_min(1e-300)
    logq = torch.log_softmax(scores.masked_fill(~support, float("-inf")), dim=-1)
    pos = p > 0
    term = torch.where(pos, p * (torch.log(torch.where(pos, p, torch.ones_like(p))) -
                                 torch.where(pos, logq, torch.zeros_like(logq))), torch.zeros_like(p))
    return term.sum(-1)


class MLA(nn.Module):
    """Multi-head latent attention, naive (MHA) form, causal, with an optional sliding window
    (row t sees keys t-W < s <= t) and parameter sinks (param_sink_number latent entries that
    every query sees: their keys and values come through kv_a_layernorm and kv_b_proj like a
    token's, their rope keys are not rotated)."""

    def __init__(self, c: PanguConfig, layer: int = 0):
        super().__init__()
        self.window = c.windows[layer] if c.windows else 0
        self.ns = c.param_sink_number
        if self.ns > 0 and c.param_sink_with_value:
            self.param_sink_compressed_kv = nn.Parameter(torch.zeros(self.ns, c.kv_lora_rank))
        else:
            self.param_sink_compressed_kv = None
        if self.ns > 0:
            self.param_sink_k_pe = nn.Parameter(torch.zeros(self.ns, c.qk_rope_head_dim))
        self.k = c.conv_kernel
        if self.k > 0:      # ModAttn: depthwise causal convs, weight [C, 1, k]
            C = {"qa_conv": c.q_lora_rank, "compresskv_conv": c.kv_lora_rank,
                 "o_conv": c.num_attention_heads * c.v_head_dim}
            for name, ch in C.items():
                setattr(self, name, nn.Conv1d(ch, ch, self.k, groups=ch, bias=False))
        self.H, self.dn, self.dr, self.dv = (c.num_attention_heads, c.qk_nope_head_dim,
                                             c.qk_rope_head_dim, c.v_head_dim)
        self.rkv = c.kv_lora_rank
        d = c.hidden_size
        if c.q_lora_rank:
            self.q_a_proj = nn.Linear(d, c.q_lora_rank, bias=False)
            self.q_a_layernorm = RMSNorm(c.q_lora_rank, 1e-6)
            self.q_b_proj = nn.Linear(c.q_lora_rank, self.H * (self.dn + self.dr), bias=False)
        else:   # q_lora_rank null (Moonlight, DeepSeek-V2-Lite): one direct projection
            self.q_proj = nn.Linear(d, self.H * (self.dn + self.dr), bias=False)
        self.kv_a_proj_with_mqa = nn.Linear(d, self.rkv + self.dr, bias=False)
        self.kv_a_layernorm = RMSNorm(self.rkv, 1e-6)
        self.kv_b_proj = nn.Linear(self.rkv, self.H * (self.dn + self.dv), bias=False)
        self.o_proj = nn.Linear(self.H * self.dv, d, bias=False)
        self.scale = c.softmax_scale()
        self.rope = apply_rope_interleave if c.rope_interleave else apply_rope
        self._masks: Dict[Tuple[int, torch.dtype, str], torch.Tensor] = {}
        self.indexer = Indexer(c) if layer in c.dsa_layers else None
        self.dsa_sparse = c.dsa_sparse
        self.last_dsa: Optional[dict] = None     # the last forward's scores, selection, row KL

    def conv(self, x: torch.Tensor, name: str, state=None, pos=None) -> torch.Tensor:
        """x + causal depthwise conv(x) for x [B,T,C] (ModAttn): out[t] = x[t] +
        sum_j w[c,0,j] x[t-(k-1)+j], zero before the first position.  state = (buffers, start,
        real) on the cached path: buffers[name] [B, capacity, C] keeps the inputs of earlier
        slots (padding slots, real == False, count as zero).  pos [B,T] (packed rows): the
        position of each token in its own sequence; a tap back b > 0 counts only when
        pos >= b (the same sequence), so the conv restarts at every boundary."""
        if self.k == 0:
            return x
        w = getattr(self, name).weight                                       # [C,1,k]
        if pos is not None:
            T, out = x.shape[1], x
            hist = F.pad(x, (0, 0, self.k - 1, 0))
            for j in range(self.k):
                back = self.k - 1 - j
                tap = hist[:, j:j + T] * w[:, 0, j]
                if back > 0:
                    tap = tap * (pos >= back).unsqueeze(-1).to(x.dtype)
                out = out + tap
            return out
        if state is None:
            hist = F.pad(x, (0, 0, self.k - 1, 0))
        else:
            bufs, start, real = state
            buf, T = bufs[name], x.shape[1]
            buf[:, start:start + T] = x * real[..., None].to(x.dtype)
            lo = start - (self.k - 1)
            hist = F.pad(buf[:, max(lo, 0):start + T], (0, 0, max(-lo, 0), 0))
        return x + F.conv1d(hist.transpose(1, 2), w, groups=x.shape[-1]).transpose(1, 2)

    def project(self, a: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, conv_state=None,
                pos=None) -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
        """The per-token projections of a [B, T, d]: q_nope [B,T,H,d_n], q_rope [B,T,H,d_r]
        (rotated), c_kv [B,T,r_kv] (after the ModAttn conv and kv_a_layernorm) and the shared
        k_rope [B,T,d_r] (rotated).  cos/sin are [T, d_r/2] (positions 0..T-1) or
        [B, T, d_r/2]."""
        B, T, _ = a.shape
        if hasattr(self, "q_proj"):
            self.last_cq = None
            q = self.q_proj(a).view(B, T, self.H, -1)
        else:
            zq = self.conv(self.q_a_proj(a), "qa_conv", conv_state, pos)
            self.last_cq = cq = self.q_a_layernorm(zq)
            q = self.q_b_proj(cq).view(B, T, self.H, -1)
        q_nope, q_rope = q.split([self.dn, self.dr], dim=-1)
        ckv, k_rope = self.kv_a_proj_with_mqa(a).split([self.rkv, self.dr], dim=-1)
        ckv = self.conv(ckv, "compresskv_conv", conv_state, pos)
        q_rope = self.rope(q_rope, cos.unsqueeze(-2), sin.unsqueeze(-2))    # [B,T,H,dr]
        k_rope = self.rope(k_rope, cos, sin)                                 # [B,T,dr], shared
        return q_nope, q_rope, self.kv_a_layernorm(ckv), k_rope

    def sink_latent(self) -> torch.Tensor:
        """[ns, r_kv + d_r]: kv_a_layernorm(param_sink_compressed_kv) (zeros without values),
        then the position-free rope key."""
        w = self.param_sink_k_pe
        if self.param_sink_compressed_kv is None:
            ckv = w.new_zeros(self.ns, self.rkv)
        else:
            ckv = self.kv_a_layernorm(self.param_sink_compressed_kv)
        return torch.cat([ckv, w], dim=-1)

    def sink_keys(self) -> Tuple[torch.Tensor, torch.Tensor]:
        """Per-head sink keys [H, ns, d_n+d_r] and values [H, ns, d_v]."""
        lat = self.sink_latent()
        k_nope, v = self.up_project(lat[None, :, :self.rkv])           # [1,ns,H,dn], [1,ns,H,dv]
        kr = lat[None, :, None, self.rkv:].expand(1, self.ns, self.H, self.dr)
        return torch.cat([k_nope, kr], dim=-1)[0].transpose(0, 1), v[0].transpose(0, 1)

    def attend(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
               bias: torch.Tensor, probs: Optional[list] = None) -> torch.Tensor:
        """softmax(scale q k^T + bias) v over the keys, with the sinks' columns in front of the
        tokens' (one softmax over both).  q [B,H,T,dq], k [B,H,S,dq], v [B,H,S,dv].  ``probs``
        (a list) receives the tokens' probabilities [B,H,T,S]."""
        scores = torch.matmul(q, k.transpose(-1, -2)) * self.scale + bias
        if self.ns == 0:
            p = torch.softmax(scores, dim=-1)
            if probs is not None:
                probs.append(p)
            return torch.matmul(p, v)
        sk, sv = self.sink_keys()                                           # [H,ns,*]
        s_scores = torch.matmul(q, sk.transpose(-1, -2)) * self.scale      # [B,H,T,ns]
        p = torch.softmax(torch.cat([s_scores, scores], dim=-1), dim=-1)
        if probs is not None:
            probs.append(p[..., self.ns:])
        return torch.matmul(p[..., :self.ns], sv) + torch.matmul(p[..., self.ns:], v)

    def up_project(self, ckv: torch.Tensor) -> Tuple[torch.Tensor, torch.Tensor]:
        """c_kv [B,T,r_kv] -> per-head k_nope [B,T,H,d_n] and v [B,T,H,d_v] (W_UK, W_UV)."""
        B, T, _ = ckv.shape
        return self.kv_b_proj(ckv).view(B, T, self.H, -1).split([self.dn, self.dv], dim=-1)

    def dsa_bias(self, a: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor,
                  sel_override: Optional[torch.Tensor], seen: Optional[torch.Tensor] = None
                  ) -> Tuple[torch.Tensor, torch.Tensor]:
        """Index scores I [B,T,T] (indexer input detached) and the support of the main attention
        and of the indexer loss [B,T,T] bool: the top-min(k, t+1) of I(t, s <= t) (ties to the
        lower index) in the sparse stage, or ``sel_override``; every causal key when dense.
        seen [B,T,T] (packed rows): the keys of the query's own sequence; the causal keys are
        then only those."""
        T = a.shape[1]
        scores = self.indexer.scores(a.detach(), self.last_cq.detach(), cos, sin)
        causal = torch.ones(T, T, dtype=torch.bool, device=a.device).tril()
        if seen is not None:
            causal = causal & seen
        if not self.dsa_sparse:
            return scores, causal.expand_as(scores)
        if sel_override is not None:
            return scores, sel_override.to(torch.bool) & causal
        with torch.no_grad():
            idx = stable_topk(scores.masked_fill(~causal, float("-inf")), self.indexer.topk)
            sel = torch.zeros_like(scores, dtype=torch.bool).scatter_(-1, idx, True)
        return scores, sel & causal

    def forward(self, a: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor,
                sel_override: Optional[torch.Tensor] = None, pack=None) -> torch.Tensor:
        """pack: None, or (pos [B,T], seen [B,T,T]) for packed rows (docs/model.md "Packed
        sequences"): cos/sin are then at each token's own position [B,T,d_r/2], and a query
        sees only the keys of its own sequence (seen), the convs restart at each boundary."""
        B, T, _ = a.shape
        H, dn, dr, dv = self.H, self.dn, self.dr, self.dv
        pos, seen = pack if pack is not None else (None, None)
        q_nope, q_rope, ckv, k_rope = self.project(a, cos, sin, None, pos)
        if self.indexer is not None:
            return self._forward_dsa(a, cos, sin, q_nope, q_rope, ckv, k_rope, sel_override, pack)
        k_nope, v = self.up_project(ckv)
        qh = torch.cat([q_nope, q_rope], dim=-1).transpose(1, 2)             # [B,H,T,dn+dr]
        kh = torch.cat([k_nope, k_rope[:, :, None, :].expand(B, T, H, dr)], dim=-1)
        kh = kh.transpose(1, 2)                                              # [B,H,T,dn+dr]
        vh = v.transpose(1, 2)                                               # [B,H,T,dv]
        # mask: 0 where the key is visible (s <= t, and t - s < W in a window), -inf otherwise
        mask = self._mask(T, a.dtype, a.device)
        if seen is not None:    # and -inf at the keys of other sequences
            mask = mask.masked_fill(~seen[:, None], float("-inf"))
        o = self.attend(qh, kh, vh, mask)                                    # [B,H,T,dv]
        return self.o_proj(self.conv(o.transpose(1, 2).reshape(B, T, H * dv), "o_conv", None,
                                     pos))

    def _forward_dsa(self, a, cos, sin, q_nope, q_rope, ckv, k_rope, sel_override, pack=None):
        """A DSA layer: the main attention over the sinks and the support (sparse stage: the
        selection), then the indexer's row KL against the head-summed token probabilities
        (detached), kept in ``last_dsa``."""
        B, T, _ = a.shape
        H, dr, dv = self.H, self.dr, self.dv
        pos, seen = pack if pack is not None else (None, None)
        scores, support = self.dsa_bias(a, cos, sin, sel_override, seen)
        k_nope, v = self.up_project(ckv)
        qh = torch.cat([q_nope, q_rope], dim=-1).transpose(1, 2)
        kh = torch.cat([k_nope, k_rope[:, :, None, :].expand(B, T, H, dr)], dim=-1).transpose(1, 2)
        bias = torch.zeros(B, 1, T, T, dtype=a.dtype, device=a.device)
        bias = bias.masked_fill(~support[:, None], float("-inf"))
        probs: list = []
        o = self.attend(qh, kh, v.transpose(1, 2), bias, probs)
        target = probs[0].detach().sum(1)                                    # [B,T,T] heads summed
        self.last_dsa = {"scores": scores.detach(), "support": support,
                         "kl": dsa_kl_rows(target, scores, support)}
        return self.o_proj(self.conv(o.transpose(1, 2).reshape(B, T, H * dv), "o_conv", None,
                                     pos))

    # ------------------------------------------------------------ KV-cached decoding
    def new_cache(self, form: str, B: int, capacity: int, dtype: torch.dtype,
                  device=None) -> Tuple[torch.Tensor, ...]:
        """Uninitialised cache buffers of this layer for ``capacity`` slots.

        naive:    (k [B,H,S,d_n+d_r], v [B,H,S,d_v]): the up-projected per-head keys (with the
                  shared rope key copied into every head) and values, as Hugging Face caches them;
        absorbed: (latent [B,S,r_kv+d_r],): [c_kv ; k_rope] per slot, one entry shared by all
                  heads (docs/model.md, absorbed / MQA form)."""
        opts = {"dtype": dtype, "device": device}
        if form == "naive":
            return (torch.empty(B, self.H, capacity, self.dn + self.dr, **opts),
                    torch.empty(B, self.H, capacity, self.dv, **opts))
        if form == "absorbed":
            return (torch.empty(B, capacity, self.rkv + self.dr, **opts),)
        raise ValueError(f"unknown MLA form {form!r} (naive | absorbed)")

    def new_conv_state(self, B: int, capacity: int, dtype: torch.dtype, device=None) -> dict:
        """ModAttn inputs of every slot, per conv [B, capacity, C] (empty without convs)."""
        if self.k == 0:
            return {}
        return {n: torch.zeros(B, capacity, getattr(self, n).weight.shape[0], dtype=dtype,
                               device=device) for n in ("qa_conv", "compresskv_conv", "o_conv")}

    def forward_cached(self, a: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, form: str,
                       cache: Tuple[torch.Tensor, ...], start: int,
                       bias: torch.Tensor, conv: Optional[dict] = None,
                       real: Optional[torch.Tensor] = None) -> torch.Tensor:
        """Attention output [B,T,d] of the T new tokens a [B,T,d], which occupy cache slots
        start..start+T-1: their keys/values are written there first, then they attend over
        slots 0..start+T-1.  cos/sin [B,T,d_r/2] at the tokens' positions; bias [B,1,T,start+T]
        is the additive mask; conv/real the ModAttn inputs of earlier slots and which of the
        new slots are real tokens."""
        if self.indexer is not None:
            raise UnsupportedConfigError("the reference's KV-cached path has no DSA indexer; use "
                                         "the full-sequence forward (compare / forward)")
        state = (conv, start, real) if self.k else None
        q_nope, q_rope, ckv, k_rope = self.project(a, cos, sin, state)
        attend = self._attend_naive if form == "naive" else self._attend_absorbed
        o = attend(q_nope, q_rope, ckv, k_rope, cache, start, self.window_bias(bias))
        return self.o_proj(self.conv(o, "o_conv", state))

    def _attend_naive(self, q_nope: torch.Tensor, q_rope: torch.Tensor, ckv: torch.Tensor,
                      k_rope: torch.Tensor, cache: Tuple[torch.Tensor, ...], start: int,
                      bias: torch.Tensor) -> torch.Tensor:
        """MHA over the cached per-head k, v; returns o [B,T,H*d_v]."""
        B, T = ckv.shape[:2]
        end = start + T
        k_cache, v_cache = cache
        k_nope, v = self.up_project(ckv)
        k_cache[:, :, start:end, :self.dn] = k_nope.transpose(1, 2)
        k_cache[:, :, start:end, self.dn:] = k_rope[:, None]                # every head
        v_cache[:, :, start:end] = v.transpose(1, 2)
        q = torch.cat([q_nope, q_rope], dim=-1).transpose(1, 2)              # [B,H,T,dn+dr]
        o = self.attend(q, k_cache[:, :, :end], v_cache[:, :, :end], bias)   # [B,H,T,dv]
        return o.transpose(1, 2).reshape(B, T, self.H * self.dv)

    def _attend_absorbed(self, q_nope: torch.Tensor, q_rope: torch.Tensor, ckv: torch.Tensor,
                         k_rope: torch.Tensor, cache: Tuple[torch.Tensor, ...], start: int,
                         bias: torch.Tensor) -> torch.Tensor:
        """MQA over the cached latent [c_kv ; k_rope]: W_UK is absorbed into the query
        (q~_h = W_UK_h q_nope_h) and W_UV into the output (o_h = W_UV_h^T o~_h); all H*T query
        rows share one key/value matrix, so each product is a single bmm per sequence."""
        B, T = ckv.shape[:2]
        H, end = self.H, start + T
        (latent,) = cache
        latent[:, start:end, :self.rkv] = ckv
        latent[:, start:end, self.rkv:] = k_rope
        w = self.kv_b_proj.weight.view(H, self.dn + self.dv, self.rkv)      # out x in, per head
        w_uk, w_uv = w[:, :self.dn], w[:, self.dn:]                 # [H,dn,rkv], [H,dv,rkv]
        q_lat = torch.einsum("bthn,hnc->bhtc", q_nope, w_uk)                 # [B,H,T,rkv]
        q = torch.cat([q_lat, q_rope.transpose(1, 2)], dim=-1).reshape(B, H * T, -1)
        kv = latent[:, :end]                                                 # [B,S,rkv+dr]
        if self.ns > 0:     # the sinks' latent rows in front of the tokens', always visible
            kv = torch.cat([self.sink_latent()[None].expand(B, -1, -1), kv], dim=1)
            bias = F.pad(bias, (self.ns, 0))
        S = kv.shape[1]
        scores = torch.bmm(q, kv.transpose(1, 2)).view(B, H, T, S) * self.scale + bias
        p = torch.softmax(scores, dim=-1).view(B, H * T, S)
        o_lat = torch.bmm(p, kv[:, :, :self.rkv]).view(B, H, T, self.rkv)
        return torch.einsum("bhtc,hvc->bthv", o_lat, w_uv).reshape(B, T, H * self.dv)

    def _mask(self, T: int, dtype: torch.dtype, device) -> torch.Tensor:
        key = (T, dtype, str(device))
        if key not in self._masks:
            self._masks.clear()
            m = torch.full((T, T), float("-inf"), dtype=dtype, device=device).triu_(1)
            if self.window > 0:     # and -inf where t - s >= W
                m = m + torch.full((T, T), float("-inf"), dtype=dtype,
                                   device=device).tril_(-self.window)
            self._masks[key] = m
        return self._masks[key]

    def window_bias(self, bias: torch.Tensor) -> torch.Tensor:
        """The cached path's additive mask [B,1,T,S] (slots) restricted to the window: slot
        distance = position distance, so key slot k is hidden from query slot q when
        q - k >= W."""
        if self.window <= 0:
            return bias
        T, S = bias.shape[-2:]
        q = torch.arange(S - T, S, device=bias.device)[:, None]
        k = torch.arange(S, device=bias.device)[None, :]
        return bias.masked_fill(q - k >= self.window, float("-inf"))


class _BiasBuffer(nn.Module):
    """Holds the selection bias so that its state_dict name is `e_score_correction.bias`."""

    def __init__(self, n: int):
        super().__init__()
        self.register_buffer("bias", torch.zeros(n))


@dataclass
class MoEOutput:
    y: torch.Tensor            # [N, d]
    sel: torch.Tensor          # [N, K] experts used (override or natural)
    natural: torch.Tensor      # [N, K] top-k on s + b of this forward
    z: torch.Tensor            # [N, N_r] router logits
    s: torch.Tensor            # [N, N_r] sigmoid scores


class MoE(nn.Module):
    """Sigmoid-routed top-k MoE with shared experts, token-grouped per-expert matmuls."""

    def select(self, choice: torch.Tensor) -> torch.Tensor:
        """Top-k of the choice scores s + b [N, E]; with n_group > 1 only the topk_group
        groups with the largest sum of their two best scores compete (DeepSeek-V3's Gate: the
        other groups are -inf).  Ties go to the lower index (group, then expert)."""
        if self.n_group > 1:
            N, E = choice.shape
            g = choice.view(N, self.n_group, E // self.n_group)
            group_scores = g.topk(2, dim=-1).values.sum(-1)
            keep = torch.zeros_like(group_scores, dtype=torch.bool)
            keep.scatter_(1, stable_topk(group_scores, self.topk_group), True)
            choice = g.masked_fill(~keep[..., None], float("-inf")).view(N, E)
        return stable_topk(choice, self.k)

    def __init__(self, c: PanguConfig):
        super().__init__()
        d = c.hidden_size
        self.n_experts, self.k = c.n_routed_experts, c.num_experts_per_tok
        self.norm_topk_prob, self.scale = c.norm_topk_prob, c.routed_scaling_factor
        self.n_group, self.topk_group = c.n_group, c.topk_group
        self.gate = nn.Linear(d, self.n_experts, bias=False)
        self.e_score_correction = _BiasBuffer(self.n_experts)
        self.experts = nn.ModuleList(SwiGLU(d, c.moe_intermediate_size)
                                     for _ in range(self.n_experts))
        self.shared_experts = (SwiGLU(d, c.n_shared_experts * c.moe_intermediate_size)
                               if c.n_shared_experts > 0 else None)

    def forward(self, x: torch.Tensor, override: Optional[torch.Tensor] = None,
                token_mask: Optional[torch.Tensor] = None) -> MoEOutput:
        N = x.shape[0]
        z = self.gate(x)
        s = torch.sigmoid(z)
        with torch.no_grad():
            natural = self.select(s + self.e_score_correction.bias)
        sel = natural if override is None else override
        s_sel = s.gather(1, sel)
        if self.norm_topk_prob:
            g = self.scale * s_sel / (s_sel.sum(-1, keepdim=True) + 1e-20)
        else:
            g = self.scale * s_sel
        y = self.shared_experts(x) if self.shared_experts is not None else torch.zeros_like(x)

        # Dispatch: (token, slot) pairs grouped by expert (stable, so token order is kept).
        flat_e = sel.reshape(-1)
        flat_t = torch.arange(N, device=x.device).repeat_interleave(self.k)
        flat_g = g.reshape(-1)
        if token_mask is not None:
            keep = token_mask.repeat_interleave(self.k)
            flat_e, flat_t, flat_g = flat_e[keep], flat_t[keep], flat_g[keep]
        if flat_e.numel() > 0:
            order = torch.sort(flat_e, stable=True).indices
            counts = torch.bincount(flat_e, minlength=self.n_experts).tolist()
            tok = flat_t[order]
            xs = x.index_select(0, tok)
            outs = [self.experts[e](chunk)
                    for e, chunk in enumerate(xs.split(counts)) if counts[e] > 0]
            ys = torch.cat(outs, dim=0) * flat_g[order].unsqueeze(-1)
            y = y.index_add(0, tok, ys)
        return MoEOutput(y=y, sel=sel, natural=natural, z=z, s=s)


def sinkhorn(R: torch.Tensor, iterations: int, eps: float = 1e-6) -> torch.Tensor:
    """Sinkhorn of [..., n, n] logits in openPangu's order (spec/model.md §7.3): a row softmax
    plus eps, a column normalisation, then (rows, columns) iterations-1 times; each divides
    by (sum + eps)."""
    M = torch.softmax(R, dim=-1) + eps
    M = M / (M.sum(dim=-2, keepdim=True) + eps)
    for _ in range(iterations - 1):
        M = M / (M.sum(dim=-1, keepdim=True) + eps)
        M = M / (M.sum(dim=-2, keepdim=True) + eps)
    return M


class MHCModule(nn.Module):
    """One mHC site (full: pre, post and the Sinkhorn mix) or the merge head (pre only) over
    streams X [..., n, d] (spec/model.md §7.3; parameters named as the checkpoint's)."""

    def __init__(self, c: PanguConfig, full: bool):
        super().__init__()
        n, nd = c.mhc_streams, c.mhc_streams * c.hidden_size
        self.n, self.full, self.it, self.eps = n, full, c.mhc_recur_norm, c.rms_norm_eps
        width = n * n + 2 * n if full else n
        self.phi = nn.Linear(nd, width, bias=False)
        self.norm_gamma = nn.Parameter(torch.ones(nd)) if c.mhc_use_gamma else None
        if full:
            self.branch_alpha = nn.Parameter(torch.zeros(3))
            self.branch_beta = nn.Parameter(torch.zeros(width))
        else:
            self.branch_alpha_pre = nn.Parameter(torch.zeros(1))
            self.branch_beta_pre = nn.Parameter(torch.zeros(width))

    @torch.no_grad()
    def reset_coefficients(self) -> None:
        """spec §7.4: alpha 0.01; b_pre = logit(1/n); b_post 0; b_res 0 / -8 off the diagonal."""
        n = self.n
        b_pre = -math.log(n - 1) if n > 1 else 8.0
        alpha = self.branch_alpha if self.full else self.branch_alpha_pre
        beta = self.branch_beta if self.full else self.branch_beta_pre
        alpha.fill_(0.01)
        beta.zero_()
        beta[:n] = b_pre
        if self.full:
            beta[2 * n:] = (-8.0 * (1 - torch.eye(n, dtype=beta.dtype))).reshape(-1)

    def coefficients(self, X: torch.Tensor):
        n = self.n
        x = X.flatten(-2)
        h = x / torch.sqrt(x.pow(2).mean(-1, keepdim=True) + self.eps)
        if self.norm_gamma is not None:
            h = self.norm_gamma * h
        m = self.phi(h)
        alpha = self.branch_alpha if self.full else self.branch_alpha_pre
        beta = self.branch_beta if self.full else self.branch_beta_pre
        pre = torch.sigmoid(alpha[0] * m[..., :n] + beta[:n]) + 1e-6
        if not self.full:
            return pre, None, None
        post = 2 * torch.sigmoid(alpha[1] * m[..., n:2 * n] + beta[n:2 * n])
        R = (alpha[2] * m[..., 2 * n:] + beta[2 * n:]).unflatten(-1, (n, n))
        return pre, post, sinkhorn(R, self.it)

    @staticmethod
    def hc_pre(X: torch.Tensor, pre: torch.Tensor) -> torch.Tensor:
        return torch.einsum("...i,...id->...d", pre, X)

    @staticmethod
    def hc_post(F_: torch.Tensor, X: torch.Tensor, post: torch.Tensor, H: torch.Tensor):
        """X'_j = post_j F + sum_i H[i, j] X_i."""
        return post[..., :, None] * F_[..., None, :] + torch.einsum("...ij,...id->...jd", H, X)


class DecoderLayer(nn.Module):
    def __init__(self, c: PanguConfig, layer: int):
        super().__init__()
        self.is_moe = c.is_moe_layer(layer)
        self.sandwich = c.sandwich_norm
        if c.mhc_streams:
            self.attn_mhc_module = MHCModule(c, True)
            self.mlp_mhc_module = MHCModule(c, True)
        self.input_layernorm = RMSNorm(c.hidden_size, c.rms_norm_eps)
        self.self_attn = MLA(c, layer)
        self.post_attention_layernorm = RMSNorm(c.hidden_size, c.rms_norm_eps)
        if c.sandwich_norm:   # post_attention_layernorm is then the post-attention norm
            self.pre_mlp_layernorm = RMSNorm(c.hidden_size, c.rms_norm_eps)
            self.post_mlp_layernorm = RMSNorm(c.hidden_size, c.rms_norm_eps)
        if layer in c.block_post:
            self.block_post_layernorm = RMSNorm(max(c.mhc_streams, 1) * c.hidden_size,
                                                c.rms_norm_eps)
        self.mlp = MoE(c) if self.is_moe else SwiGLU(c.hidden_size, c.intermediate_size)

    def ffn_norm(self, x: torch.Tensor) -> torch.Tensor:
        return (self.pre_mlp_layernorm if self.sandwich else self.post_attention_layernorm)(x)

    def site(self, X: torch.Tensor, ffn: bool, sublayer) -> torch.Tensor:
        """One residual site (spec §8): the sublayer's input from the residual X (hc_pre with
        mHC, else X itself), its output through the sandwich norm back into X (hc_post, else
        a sum); after the FFN, the block post-norm over all streams."""
        mod = getattr(self, "mlp_mhc_module" if ffn else "attn_mhc_module", None)
        if mod is not None:
            pre, post, H = mod.coefficients(X)
            out = sublayer(mod.hc_pre(X, pre))
        else:
            out = sublayer(X)
        if self.sandwich:
            out = (self.post_mlp_layernorm if ffn else self.post_attention_layernorm)(out)
        X = mod.hc_post(out, X, post, H) if mod is not None else X + out
        if ffn and hasattr(self, "block_post_layernorm"):
            X = self.block_post_layernorm(X.flatten(-2)).view_as(X) if mod is not None \
                else self.block_post_layernorm(X)
        return X


class MTPLayer(DecoderLayer):
    """MTP module k (spec §9, docs/model.md "Multi-token prediction"), stored as layer L+k-1:
    h' = eh_proj([enorm(Emb(t_{i+k})) ; hnorm(h^{k-1}_i)]) (embedding first), then a plain
    decoder layer (ordinary residual: no mHC, no ModAttn conv, no block post-norm; sandwich
    norms when on), then shared_head.norm / shared_head.head when the config has them."""

    def __init__(self, c: PanguConfig, layer: int):
        plain = replace(c, mhc_streams=0, conv_kernel=0, block_post=[])
        super().__init__(plain, layer)
        d = c.hidden_size
        self.enorm = RMSNorm(d, c.rms_norm_eps)
        self.hnorm = RMSNorm(d, c.rms_norm_eps)
        self.eh_proj = nn.Linear(2 * d, d, bias=False)
        self.shared_head = nn.Module()
        if c.mtp_head_norm:
            self.shared_head.norm = RMSNorm(d, c.rms_norm_eps)
        if c.mtp_head:
            self.shared_head.head = nn.Linear(d, c.vocab_size, bias=False)

    def project(self, emb: torch.Tensor, h: torch.Tensor) -> torch.Tensor:
        return self.eh_proj(torch.cat([self.enorm(emb), self.hnorm(h)], dim=-1))


class PanguTrunk(nn.Module):
    def __init__(self, c: PanguConfig):
        super().__init__()
        self.n_streams = c.mhc_streams
        self.embed_tokens = nn.Embedding(c.vocab_size, c.hidden_size)
        L = c.num_hidden_layers   # MTP layers follow the trunk's in the same list (names L..)
        self.layers = nn.ModuleList([DecoderLayer(c, l) for l in range(L)] +
                                    [MTPLayer(c, L + k) for k in range(c.mtp_layers)])
        if c.mhc_streams:
            self.merge_mhc_module = MHCModule(c, False)
        self.norm = RMSNorm(c.hidden_size, c.rms_norm_eps)

    def streams(self, h: torch.Tensor) -> torch.Tensor:
        """The residual at the model start: the embedding in every mHC stream."""
        if not self.n_streams:
            return h
        return h[..., None, :].expand(*h.shape[:-1], self.n_streams, h.shape[-1])

    def merge(self, X: torch.Tensor) -> torch.Tensor:
        """The merge head before the final norm (pre only)."""
        if not self.n_streams:
            return X
        pre, _, _ = self.merge_mhc_module.coefficients(X)
        return self.merge_mhc_module.hc_pre(X, pre)


@dataclass
class ForwardOutput:
    logits: torch.Tensor                 # [B, T, V]
    hidden: torch.Tensor                 # [B, T, d] h0: merged trunk state before the norm
    valid: torch.Tensor                  # [B, T] bool, t < len
    routes: Dict[int, torch.Tensor]      # layer -> [B, T, K] experts used
    natural_routes: Dict[int, torch.Tensor]  # layer -> [B, T, K] top-k on s + b
    router_logits: Dict[int, torch.Tensor]   # layer -> [B, T, N_r] (in the graph)
    router_scores: Dict[int, torch.Tensor]   # layer -> [B, T, N_r] sigmoid (in the graph)
    dsa: Dict[int, dict] = field(default_factory=dict)  # DSA layer -> MLA.last_dsa
    pos: Optional[torch.Tensor] = None   # [B, T] packed rows: position in the sequence, or None
    seq: Optional[torch.Tensor] = None   # [B, T] packed rows: sequence_ids (balance loss)
    scores: Optional[torch.Tensor] = None  # [B] score head at each row's last valid token


@dataclass
class LossOutput:
    loss: torch.Tensor                   # scalar: main + balance + z
    main: torch.Tensor                   # sum w * logp
    balance: torch.Tensor
    z: torch.Tensor
    index: torch.Tensor                  # DSA indexer KL: per layer the mean over valid rows,
                                         # summed (only the indexers learn from it)
    logp: torch.Tensor                   # [B, T], 0 where no target / padding
    has_target: torch.Tensor             # [B, T] bool
    forward: ForwardOutput
    mtp: Optional[torch.Tensor] = None   # lambda/D sum_k sum_i w*logp of the MTP modules


@dataclass
class KVCache:
    """Per-layer KV cache of a left-padded batch of B sequences (built by ``prefill``).

    Slot j of sequence b holds the token at position j - pad[b]; the slots below pad[b] are
    left padding.  The buffers are allocated once for ``capacity`` slots (like Hugging Face's
    StaticCache) and written in place; slots 0..length-1 are filled."""
    form: str                                   # "naive" | "absorbed" (see MLA.new_cache)
    pad: torch.Tensor                           # [B] long, padding slots of each sequence
    capacity: int
    layers: List[Tuple[torch.Tensor, ...]]      # MLA.new_cache of every layer
    conv: List[dict] = field(default_factory=list)  # MLA.new_conv_state of every layer
    length: int = 0

    def bytes_per_token(self) -> int:
        """Bytes one token of one sequence occupies in the cache, summed over the layers."""
        slots = self.pad.shape[0] * self.capacity
        return sum(t.numel() // slots * t.element_size() for lc in self.layers for t in lc)

    def slots(self, T: int) -> torch.Tensor:
        """Slot numbers [T] of the next T tokens."""
        return torch.arange(self.length, self.length + T, device=self.pad.device)

    def real(self, T: int) -> torch.Tensor:
        """[B, T] bool: which of the next T slots hold a real (not padding) token."""
        return self.slots(T)[None, :] >= self.pad[:, None]

    def positions(self, T: int) -> torch.Tensor:
        """RoPE positions [B, T] of the next T tokens (0 at padding slots)."""
        return (self.slots(T)[None, :] - self.pad[:, None]).clamp(min=0)

    def attention_bias(self, T: int, dtype: torch.dtype) -> torch.Tensor:
        """Additive mask [B, 1, T, length+T] of the next T tokens: a token sees the real tokens
        in its own and earlier slots; a padding token sees only itself, so that its row stays
        finite (no real token reads it)."""
        q = self.slots(T)[:, None]                                           # [T,1]
        k = torch.arange(self.length + T, device=self.pad.device)[None, :]   # [1,S]
        seen = ((k <= q) & (k >= self.pad[:, None, None])) | (k == q)       # [B,T,S]
        bias = torch.zeros(seen.shape, dtype=dtype, device=self.pad.device)
        return bias.masked_fill_(~seen, float("-inf"))[:, None]


RouteOverride = Union[None, Sequence[Optional[torch.Tensor]], Mapping[int, Optional[torch.Tensor]]]


class PanguRef(nn.Module):
    """The model of docs/model.md.  ``PanguRef(config_dict)``; parameters are named exactly as
    the checkpoint tensors (``model.layers.{l}....weight``, ``lm_head.weight``); the selection
    bias is the buffer ``model.layers.{l}.mlp.e_score_correction.bias``."""

    def __init__(self, config: Mapping[str, object], dtype: Optional[torch.dtype] = None):
        super().__init__()
        self.raw_config = dict(config)
        self.cfg = c = parse_config(config)
        self.model = PanguTrunk(c)
        self.lm_head = nn.Linear(c.hidden_size, c.vocab_size, bias=False)
        # a reward model (docs/model.md "Score head"): architectures [*ForSequenceClassification]
        arch = (config.get("architectures") or [""])[0]
        self.score = None
        if isinstance(arch, str) and arch.endswith("ForSequenceClassification"):
            if config.get("num_labels", 1) != 1:
                raise UnsupportedConfigError("config key 'num_labels' must be 1 (a scalar head)")
            self.score = nn.Linear(c.hidden_size, 1, bias=False)
        self.moe_layers = [l for l in range(c.num_hidden_layers) if c.is_moe_layer(l)]
        # every layer with a selection bias: the trunk's MoE layers, then the MTP layers'
        self.bias_layers = [l for l in range(c.num_hidden_layers + c.mtp_layers)
                            if c.is_moe_layer(l)]
        self._rope_cache: Dict[Tuple[int, torch.dtype, str], Tuple[torch.Tensor, torch.Tensor]] = {}
        if dtype is not None:
            self.to(dtype)

    # ---------------------------------------------------------------- initialisation / names
    @torch.no_grad()
    def init_weights(self, std: Optional[float] = None,
                     generator: Optional[torch.Generator] = None) -> None:
        """N(0, std) for every Linear / embedding weight (std = initializer_range), 1 for norm
        gains, 0 for the selection biases."""
        std = self.cfg.initializer_range if std is None else std
        for mod in self.modules():
            if isinstance(mod, (nn.Linear, nn.Embedding)):
                mod.weight.normal_(0.0, std, generator=generator)
            elif isinstance(mod, RMSNorm):
                mod.weight.fill_(1.0)
            elif isinstance(mod, _BiasBuffer):
                mod.bias.zero_()
            elif isinstance(mod, nn.Conv1d):     # ModAttn kernels start as the identity
                mod.weight.zero_()
            elif isinstance(mod, MHCModule):     # phi is an nn.Linear (drawn above)
                mod.reset_coefficients()
            elif isinstance(mod, MLA) and mod.ns > 0:
                mod.param_sink_k_pe.normal_(0.0, std, generator=generator)
                if mod.param_sink_compressed_kv is not None:
                    mod.param_sink_compressed_kv.normal_(0.0, std, generator=generator)

    def bias_buffer_names(self) -> List[str]:
        return [f"model.layers.{l}.mlp.e_score_correction.bias" for l in self.bias_layers]

    @property
    def dtype(self) -> torch.dtype:
        return self.lm_head.weight.dtype

    def _rope(self, T: int, device) -> Tuple[torch.Tensor, torch.Tensor]:
        key = (T, self.dtype, str(device))
        if key not in self._rope_cache:
            self._rope_cache[key] = rope_cos_sin_scaled(T, self.cfg.qk_rope_head_dim,
                                                        self.cfg.rope_theta,
                                                        self.cfg.rope_scaling, self.dtype, device)
        return self._rope_cache[key]

    # ---------------------------------------------------------------- forward
    def _override_for(self, route_override: RouteOverride, layer: int, idx: int, B: int, T: int,
                      valid: torch.Tensor) -> Optional[torch.Tensor]:
        if route_override is None:
            return None
        if isinstance(route_override, Mapping):
            r = route_override.get(layer)
        else:
            if len(route_override) != len(self.moe_layers):
                raise ValueError(f"route_override has {len(route_override)} entries; expected "
                                 f"one per MoE layer ({len(self.moe_layers)})")
            r = route_override[idx]
        if r is None:
            return None
        K, E = self.cfg.num_experts_per_tok, self.cfg.n_routed_experts
        r = torch.as_tensor(r).to(device=valid.device, dtype=torch.long)
        if r.dim() == 3 and tuple(r.shape) == (B, T, K):
            r = r.reshape(B * T, K)
        elif r.dim() == 2 and tuple(r.shape) == (B * T, K):
            pass
        elif r.dim() == 2 and r.shape[1] == K and r.shape[0] == int(valid.sum()):
            full = torch.arange(K, device=r.device).repeat(B * T, 1)
            full[valid.reshape(-1)] = r
            r = full
        else:
            raise ValueError(f"route_override for layer {layer}: shape {tuple(r.shape)}; expected "
                             f"[{B},{T},{K}], [{B * T},{K}] or [N_valid,{K}]")
        if r.numel() and (int(r.min()) < 0 or int(r.max()) >= E):
            raise ValueError(f"route_override for layer {layer}: expert index out of [0, {E})")
        return r

    def forward(self, tokens: torch.Tensor, lens: Optional[torch.Tensor] = None,
                route_override: RouteOverride = None,
                dsa_override: Optional[Mapping[int, torch.Tensor]] = None,
                pos: Optional[torch.Tensor] = None) -> ForwardOutput:
        """tokens [B, T] int; lens [B] (valid prefix length, None = all valid); dsa_override:
        DSA layer -> selection [B, T, T] to use instead of the indexer's top-k; pos [B, T]
        (packed rows, docs/model.md "Packed sequences"): each token's position in its own
        sequence, 0 starting one, -1 padding; every sequence is then computed as if alone."""
        c = self.cfg
        tokens = torch.as_tensor(tokens)
        if tokens.dim() != 2:
            raise ValueError(f"tokens must be [B, T], got {tuple(tokens.shape)}")
        B, T = tokens.shape
        device = self.lm_head.weight.device
        tokens = tokens.to(device=device, dtype=torch.long)
        if c.max_position_embeddings is not None and T > c.max_position_embeddings:
            raise ValueError(f"sequence length {T} exceeds max_position_embeddings "
                             f"{c.max_position_embeddings}")
        if lens is None:
            valid = torch.ones(B, T, dtype=torch.bool, device=device)
            token_mask = None
        else:
            lens = torch.as_tensor(lens).to(device=device, dtype=torch.long)
            if tuple(lens.shape) != (B,) or (lens.numel() and (int(lens.min()) < 0 or
                                                                 int(lens.max()) > T)):
                raise ValueError(f"lens must be [B] with values in [0, {T}]")
            valid = torch.arange(T, device=device)[None, :] < lens[:, None]
            token_mask = None if bool(valid.all()) else valid.reshape(-1)
        pack = None
        if pos is not None:
            pos = torch.as_tensor(pos).to(device=device, dtype=torch.long)
            if tuple(pos.shape) != (B, T):
                raise ValueError(f"pos must be [B, T] = [{B}, {T}]")
            if self.score is not None:   # one score per row, read at its length (as prl)
                raise ValueError("a score head takes one sequence per row: no packed rows (pos)")
            prev = F.pad(pos[:, :-1], (1, 0), value=-1)
            ok = (pos == -1) | (pos == 0) | ((prev >= 0) & (pos == prev + 1))
            if not bool((ok | ~valid).all()):
                raise ValueError("pos: each value must be -1, 0 or the previous position + 1")
            valid = valid & (pos >= 0)
            token_mask = None if bool(valid.all()) else valid.reshape(-1)
        tokens = tokens.masked_fill(~valid, 0)          # padding ids never reach the model
        if tokens.numel() and (int(tokens.min()) < 0 or int(tokens.max()) >= c.vocab_size):
            raise ValueError(f"token id out of [0, {c.vocab_size}) at a valid position")

        cos, sin = self._rope(T, device)
        if pos is not None:
            cos, sin, pack = packed_rope(pos, cos, sin)
        X = self.model.streams(self.model.embed_tokens(tokens))
        routes, natural, zs, ss = {}, {}, {}, {}
        moe_idx = 0
        dsa = {}
        for l, layer in enumerate(self.model.layers[:c.num_hidden_layers]):
            sel_ov = None if dsa_override is None else dsa_override.get(l)
            X = layer.site(X, False, lambda a, sel_ov=sel_ov: layer.self_attn(
                layer.input_layernorm(a), cos, sin, sel_ov, pack))
            if layer.self_attn.indexer is not None:
                dsa[l] = layer.self_attn.last_dsa

            def ffn(a, l=l, layer=layer):
                nonlocal moe_idx
                f = layer.ffn_norm(a)
                if not layer.is_moe:
                    return layer.mlp(f)
                ov = self._override_for(route_override, l, moe_idx, B, T, valid)
                mo = layer.mlp(f.reshape(B * T, -1), ov, token_mask)
                K, E = c.num_experts_per_tok, c.n_routed_experts
                routes[l] = mo.sel.view(B, T, K)
                natural[l] = mo.natural.view(B, T, K)
                zs[l], ss[l] = mo.z.view(B, T, E), mo.s.view(B, T, E)
                moe_idx += 1
                return mo.y.view(B, T, -1)

            X = layer.site(X, True, ffn)
        h0 = self.model.merge(X)
        hn = self.model.norm(h0)
        logits = self.lm_head(hn)
        scores = None
        if self.score is not None:   # r_b = score . h_b at t = len_b - 1
            last = valid.sum(dim=1).clamp(min=1) - 1
            scores = self.score(hn[torch.arange(B, device=device), last]).squeeze(-1)
        return ForwardOutput(logits=logits, hidden=h0, valid=valid, routes=routes,
                             natural_routes=natural, router_logits=zs, router_scores=ss, dsa=dsa,
                             pos=pos, seq=None if pos is None else sequence_ids(pos, valid),
                             scores=scores)

    def mtp_loss(self, out: ForwardOutput, tokens: torch.Tensor, targets: torch.Tensor,
                 weights: torch.Tensor) -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """The MTP modules on a forward's h0 (spec §9.1): module k at position i reads
        h^{k-1}_i and Emb(t_{i+k}) and is scored on targets[i+k] (= t_{i+k+1}) with weight
        lambda/D * weights[i+k] at temperature 1, over i + k < len (a row keeps at least one
        valid position). Packed rows (out.pos): i + k must be in i's own sequence, the last k
        positions of each sequence are padding (no row is kept for a sequence of <= k).
        Returns (sum w*logp, balance loss, z-loss) of the MTP layers."""
        c = self.cfg
        B, T = tokens.shape
        device = out.logits.device
        tokens = torch.as_tensor(tokens).to(device=device, dtype=torch.long)
        targets = torch.as_tensor(targets).to(device=device, dtype=torch.long)
        weights = torch.as_tensor(weights).to(device=device, dtype=self.dtype)
        lens = out.valid.sum(1)
        cos_t, sin_t = self._rope(T, device)
        cos, sin, pack = cos_t, sin_t, None
        h, zero = out.hidden, out.logits.new_zeros(())
        total, bal, zl = zero, zero, zero
        pos = torch.arange(T, device=device)[None, :]
        for k in range(1, c.mtp_layers + 1):
            layer = self.model.layers[c.num_hidden_layers + k - 1]
            src = (pos + k).clamp(max=T - 1).expand(B, T)
            inside = pos + k < lens[:, None]                              # [B,T]
            seq_k = None
            if out.pos is not None:   # packed: the same sequence k positions on (a valid one)
                P, V = out.pos, out.valid
                inside = ((pos + k < T) & V & V.gather(1, src) & (P.gather(1, src) == P + k))
                pos_k = torch.where(inside, P, torch.full_like(P, -1))
                cos, sin, pack = packed_rope(pos_k, cos_t, sin_t)
                seq_k = sequence_ids(pos_k, inside)
            tok_k = torch.where(inside, tokens.gather(1, src), torch.zeros_like(tokens))
            tgt_k = torch.where(inside, targets.gather(1, src), torch.full_like(targets, -1))
            w_k = torch.where(inside, weights.gather(1, src), torch.zeros_like(weights))
            w_k = w_k * (c.mtp_loss_weight / c.mtp_layers)
            valid_k = pos < (lens[:, None] - k).clamp(min=1) if out.pos is None else inside
            mask = None if bool(valid_k.all()) else valid_k.reshape(-1)
            x = layer.project(self.model.embed_tokens(tok_k), h)
            x = layer.site(x, False, lambda a: layer.self_attn(layer.input_layernorm(a), cos, sin,
                                                                 None, pack))
            moe = {}

            def ffn(a, layer=layer, mask=mask):
                f = layer.ffn_norm(a)
                if not layer.is_moe:
                    return layer.mlp(f)
                mo = layer.mlp(f.reshape(B * T, -1), None, mask)
                moe.update(sel=mo.sel.view(B, T, -1), z=mo.z.view(B, T, -1), s=mo.s.view(B, T, -1))
                return mo.y.view(B, T, -1)

            h = layer.site(x, True, ffn)
            norm = getattr(layer.shared_head, "norm", self.model.norm)
            head = getattr(layer.shared_head, "head", self.lm_head)
            logits = head(norm(h))
            has_t = valid_k & (tgt_k >= 0)
            logp = F.log_softmax(logits, -1).gather(
                -1, torch.where(has_t, tgt_k, torch.zeros_like(tgt_k)).unsqueeze(-1)).squeeze(-1)
            total = total + torch.where(has_t, w_k * logp, torch.zeros_like(logp)).sum()
            if moe:  # the MTP MoE's own auxiliary losses, over its valid positions
                fo = ForwardOutput(logits=logits, hidden=h, valid=valid_k, routes={0: moe["sel"]},
                                   natural_routes={}, router_logits={0: moe["z"]},
                                   router_scores={0: moe["s"]}, seq=seq_k)
                bal = bal + self.balance_loss(fo)
                zl = zl + self.router_z_loss(fo)
        return total, bal, zl

    # ---------------------------------------------------------------- losses
    def balance_loss(self, out: ForwardOutput, alpha: Optional[float] = None) -> torch.Tensor:
        """alpha * sum_layers (1/B) sum_b sum_i f_i P_i over each sequence's valid positions
        (sequences without valid positions contribute 0; B is the batch size)."""
        alpha = self.cfg.balance_loss_alpha if alpha is None else alpha
        total = out.logits.new_zeros(())
        if alpha == 0.0 or not out.routes:
            return total
        if out.seq is not None:
            return alpha * self._balance_packed(out)
        valid = out.valid
        B = valid.shape[0]
        Tb = valid.sum(1).to(self.dtype)                                    # [B]
        has = Tb > 0
        K, E = self.cfg.num_experts_per_tok, self.cfg.n_routed_experts
        vm = valid.unsqueeze(-1)
        for l, sel in out.routes.items():
            s = out.router_scores[l]                                        # [B,T,E]
            with torch.no_grad():
                ind = torch.zeros_like(s).scatter_(-1, sel, 1.0)            # 1[i in sel_t]
                ind = torch.where(vm, ind, torch.zeros_like(ind))
                f = ind.sum(1) * (E / K) / Tb.clamp(min=1).unsqueeze(-1)    # [B,E], constant
            sn = s / s.sum(-1, keepdim=True)
            P = torch.where(vm, sn, torch.zeros_like(sn)).sum(1) / Tb.clamp(min=1).unsqueeze(-1)
            per_seq = (f * P).sum(-1)
            total = total + torch.where(has, per_seq, torch.zeros_like(per_seq)).sum() / B
        return alpha * total

    def _balance_packed(self, out: ForwardOutput) -> torch.Tensor:
        """Packed rows: sum_layers of the mean over sequences (out.seq) of sum_i f_i P_i, each
        over its sequence's valid positions (f, P as in balance_loss)."""
        valid = out.valid
        ids, inv = torch.unique(out.seq[valid], return_inverse=True)
        S = ids.numel()
        cnt = torch.bincount(inv, minlength=S).to(self.dtype)[:, None]     # [S,1]
        K, E = self.cfg.num_experts_per_tok, self.cfg.n_routed_experts
        total = out.logits.new_zeros(())
        for l, sel in out.routes.items():
            s = out.router_scores[l]
            with torch.no_grad():
                ind = torch.zeros_like(s).scatter_(-1, sel, 1.0)[valid]     # [N_valid,E]
                f = s.new_zeros(S, E).index_add_(0, inv, ind) * (E / K) / cnt
            sn = (s / s.sum(-1, keepdim=True))[valid]
            P = s.new_zeros(S, E).index_add(0, inv, sn) / cnt
            total = total + (f * P).sum() / S
        return total

    def router_z_loss(self, out: ForwardOutput, beta: Optional[float] = None) -> torch.Tensor:
        """beta * sum_layers (1/N_valid) sum_t (logsumexp_i z_{t,i})^2 over valid positions."""
        beta = self.cfg.router_z_loss_coef if beta is None else beta
        total = out.logits.new_zeros(())
        n_valid = int(out.valid.sum())
        if beta == 0.0 or not out.routes or n_valid == 0:
            return total
        for l in out.routes:
            lse = torch.logsumexp(out.router_logits[l], dim=-1)            # [B,T]
            total = total + torch.where(out.valid, lse * lse, torch.zeros_like(lse)).sum() / n_valid
        return beta * total

    def index_loss(self, out: ForwardOutput) -> torch.Tensor:
        """Sum over DSA layers of the mean row KL over valid query rows."""
        total = out.logits.new_zeros(())
        n = int(out.valid.sum())
        for d in out.dsa.values():
            total = total + torch.where(out.valid, d["kl"], torch.zeros_like(d["kl"])).sum() / max(n, 1)
        return total

    def compute_loss(self, tokens: torch.Tensor, lens: Optional[torch.Tensor],
                     targets: torch.Tensor, weights: torch.Tensor, temperature: float = 1.0,
                     route_override: RouteOverride = None,
                     dsa_override: Optional[Mapping[int, torch.Tensor]] = None,
                     pos: Optional[torch.Tensor] = None,
                     score_weights: Optional[torch.Tensor] = None) -> LossOutput:
        """loss = sum_t w_t * logp_t + balance + z, logp_t = log_softmax(logits_t / tau)[y_t],
        over positions t < len with a target (y_t >= 0); a reward model with score_weights g
        [B] adds sum_b g_b * score_b."""
        if not temperature > 0:
            raise ValueError(f"temperature must be > 0, got {temperature}")
        out = self.forward(tokens, lens, route_override, dsa_override, pos)
        B, T, V = out.logits.shape
        device = out.logits.device
        targets = torch.as_tensor(targets).to(device=device, dtype=torch.long)
        weights = torch.as_tensor(weights).to(device=device, dtype=self.dtype)
        if tuple(targets.shape) != (B, T) or tuple(weights.shape) != (B, T):
            raise ValueError("targets and weights must be [B, T]")
        has_t = out.valid & (targets >= 0)
        tgt = torch.where(has_t, targets, torch.zeros_like(targets))
        if tgt.numel() and int(tgt.max()) >= V:
            raise ValueError(f"target id out of [0, {V})")
        scaled = out.logits if temperature == 1.0 else out.logits / temperature
        logp_all = F.log_softmax(scaled, dim=-1)
        logp = logp_all.gather(-1, tgt.unsqueeze(-1)).squeeze(-1)
        zero = torch.zeros_like(logp)
        logp = torch.where(has_t, logp, zero)
        w = torch.where(has_t, weights, torch.zeros_like(weights))
        main = (w * logp).sum()
        bal = self.balance_loss(out)
        zl = self.router_z_loss(out)
        mtp = torch.zeros_like(main)
        if self.cfg.mtp_layers > 0:
            mtp, mbal, mzl = self.mtp_loss(out, tokens, targets, weights)
            bal, zl = bal + mbal, zl + mzl
        if score_weights is not None and out.scores is not None:
            g = torch.as_tensor(score_weights).to(device=device, dtype=self.dtype)
            main = main + (g * out.scores).sum()
        return LossOutput(loss=main + bal + zl + mtp, main=main, balance=bal, z=zl,
                          index=self.index_loss(out), logp=logp, has_target=has_t, forward=out,
                          mtp=mtp)

    # ---------------------------------------------------------------- selection-bias update
    @torch.no_grad()
    def update_selection_bias(self, routes: Mapping[int, torch.Tensor], valid: torch.Tensor,
                              rate: Optional[float] = None, rule: str = "sign") -> None:
        """After an optimizer step: per MoE layer, counts c_i over valid tokens;
        sign rule b_i += rate*sign(cbar - c_i), cbar = K*N_valid/N_r;
        rms rule b_i -= rate*(F_i - 1/N_r)/sqrt(mean_j (F_j - 1/N_r)^2 + 1e-12), F = c/sum c."""
        rate = self.cfg.bias_update_rate if rate is None else rate
        if rate == 0.0:
            return
        E, K = self.cfg.n_routed_experts, self.cfg.num_experts_per_tok
        n_valid = int(valid.sum())
        for l, sel in routes.items():
            b = self.model.layers[l].mlp.e_score_correction.bias
            cnt = torch.bincount(sel[valid].reshape(-1), minlength=E).to(torch.float64)
            if rule == "sign":
                cbar = K * n_valid / E
                b += (rate * torch.sign(cbar - cnt)).to(b.dtype)
            elif rule == "rms":
                if cnt.sum() == 0:
                    continue
                dev = cnt / cnt.sum() - 1.0 / E
                b -= (rate * dev / torch.sqrt((dev * dev).mean() + 1e-12)).to(b.dtype)
            else:
                raise ValueError(f"unknown bias update rule {rule!r} (sign | rms)")

    # ---------------------------------------------------------------- KV-cached decoding
    @torch.inference_mode()
    def new_kv_cache(self, pad: torch.Tensor, capacity: int, form: str = "naive") -> KVCache:
        """An empty cache of ``capacity`` slots for len(pad) left-padded sequences.  Its
        buffers are inference tensors: the cached path runs under torch.inference_mode()."""
        limit = self.cfg.max_position_embeddings
        if limit is not None and capacity > limit:
            raise ValueError(f"prompt + new tokens = {capacity} slots exceed "
                             f"max_position_embeddings {limit}")
        device = self.lm_head.weight.device
        layers = [layer.self_attn.new_cache(form, pad.shape[0], capacity, self.dtype, device)
                  for layer in self.model.layers[:self.cfg.num_hidden_layers]]
        conv = [layer.self_attn.new_conv_state(pad.shape[0], capacity, self.dtype, device)
                for layer in self.model.layers[:self.cfg.num_hidden_layers]]
        return KVCache(form=form, pad=pad.to(device=device, dtype=torch.long),
                       capacity=capacity, layers=layers, conv=conv)

    @torch.inference_mode()
    def forward_cached(self, tokens: torch.Tensor, cache: KVCache) -> torch.Tensor:
        """Run tokens [B, T] (the next T slots of every sequence) through the model, appending
        their keys/values to ``cache``; return the logits of the last slot [B, V].  Tokens at
        padding slots only need to be valid ids; they skip the routed experts."""
        B, T = tokens.shape
        if cache.length + T > cache.capacity:
            raise ValueError(f"KV cache full: {cache.length} + {T} > {cache.capacity} slots")
        cos_table, sin_table = self._rope(cache.capacity, self.lm_head.weight.device)
        pos = cache.positions(T)
        cos, sin = cos_table[pos], sin_table[pos]                            # [B,T,dr/2]
        bias = cache.attention_bias(T, self.dtype)
        real_bt = cache.real(T)
        real = real_bt.reshape(-1)
        token_mask = None if bool(real.all()) else real
        X = self.model.streams(self.model.embed_tokens(tokens))
        for layer, layer_cache, conv in zip(self.model.layers, cache.layers, cache.conv):
            X = layer.site(X, False, lambda a: layer.self_attn.forward_cached(
                layer.input_layernorm(a), cos, sin, cache.form, layer_cache, cache.length, bias,
                conv, real_bt))

            def ffn(a, layer=layer):
                f = layer.ffn_norm(a)
                if layer.is_moe:
                    return layer.mlp(f.reshape(B * T, -1), None, token_mask).y.view(B, T, -1)
                return layer.mlp(f)

            X = layer.site(X, True, ffn)
        cache.length += T
        return self.lm_head(self.model.norm(self.model.merge(X)[:, -1]))


# =============================================================================================
# KV-cached generation (the decode benchmark peer and the greedy-token oracle)
# =============================================================================================

MLA_FORMS = ("naive", "absorbed")
EOS_ID = 2


def left_pad(prompts: Sequence[Sequence[int]], vocab_size: int,
             pad_id: int = 0) -> Tuple[torch.Tensor, torch.Tensor]:
    """Prompts (non-empty lists of ids in [0, vocab)) -> tokens [B, P] left-padded with
    ``pad_id`` to the longest prompt, and pad [B] (the padding slots of each row)."""
    if not prompts:
        raise ValueError("no prompts")
    P = max(len(p) for p in prompts)
    tokens = torch.full((len(prompts), P), pad_id, dtype=torch.long)
    for b, prompt in enumerate(prompts):
        if not prompt or not all(isinstance(t, int) and 0 <= t < vocab_size for t in prompt):
            raise ValueError(f"prompt {b}: expected a non-empty list of token ids in "
                             f"[0, {vocab_size})")
        tokens[b, P - len(prompt):] = torch.tensor(prompt, dtype=torch.long)
    return tokens, torch.tensor([P - len(p) for p in prompts], dtype=torch.long)


@torch.inference_mode()
def prefill(model: PanguRef, prompts: Sequence[Sequence[int]], new_tokens: int,
            form: str = "naive") -> Tuple[KVCache, torch.Tensor]:
    """Allocate a cache for the prompts plus ``new_tokens`` and run the left-padded prompts
    through the model in one forward; returns (cache, logits after each prompt [B, V])."""
    tokens, pad = left_pad(prompts, model.cfg.vocab_size)
    cache = model.new_kv_cache(pad, tokens.shape[1] + new_tokens, form)
    return cache, model.forward_cached(tokens.to(cache.pad.device), cache)


def choose_tokens(logits: torch.Tensor, temperature: float = 0.0,
                  generator: Optional[torch.Generator] = None
                  ) -> Tuple[torch.Tensor, torch.Tensor]:
    """Next token of each row of logits [B, V] and its log-prob.  temperature 0: greedy
    (argmax; on equal logits the lower id wins), log-prob under log_softmax(logits); else a
    draw from softmax(logits / temperature) with ``generator``, log-prob under that
    distribution."""
    if temperature == 0.0:
        tok = torch.argmax(logits, dim=-1)
        logp = F.log_softmax(logits, dim=-1)
    else:
        logp = F.log_softmax(logits / temperature, dim=-1)
        tok = torch.multinomial(logp.exp(), 1, generator=generator).squeeze(-1)
    return tok, logp.gather(-1, tok[:, None]).squeeze(-1)


@dataclass
class Generation:
    tokens: List[List[int]]        # per sequence: the new tokens (with stop_eos: up to EOS)
    logprobs: List[List[float]]    # log-prob of each new token (see choose_tokens)
    stopped: List[bool]            # the sequence ended at EOS (stop_eos only)
    prefill_seconds: float
    decode_seconds: float
    decode_steps: int              # one-token forward steps run (new_tokens unless all stopped)
    kv_cache_bytes_per_token: int
    margins: Optional[List[List[float]]] = None   # best minus second-best logit per new token


@torch.inference_mode()
def generate(model: PanguRef, prompts: Sequence[Sequence[int]], new_tokens: int,
             form: str = "naive", temperature: float = 0.0,
             generator: Optional[torch.Generator] = None, stop_eos: bool = False,
             eos_id: int = EOS_ID, margins: bool = False) -> Generation:
    """Batched KV-cached generation of ``new_tokens`` tokens after each prompt.

    Prefill runs the left-padded prompts in one forward, which fills the cache and gives the
    logits after each prompt.  Decode then runs ``new_tokens`` steps: step i chooses token i
    of every sequence from the current logits and runs it through the model (one token per
    sequence, against the cache), which gives the logits for step i+1.  So decode is exactly
    B*new_tokens one-token forwards (the last step's logits go unused).  With ``stop_eos`` a
    sequence ends at its first ``eos_id`` (kept in its output; later steps feed it eos_id) and
    decoding stops as soon as every sequence has ended.  ``margins`` also records, per new
    token, the gap between the best and second-best logit (how near a greedy tie it was)."""
    t0 = time.perf_counter()
    cache, logits = prefill(model, prompts, new_tokens, form)
    t1 = time.perf_counter()
    B = len(prompts)
    tokens = torch.zeros(B, new_tokens, dtype=torch.long)
    logprobs = torch.zeros(B, new_tokens, dtype=torch.float64)
    gaps = torch.zeros(B, new_tokens, dtype=torch.float64)
    lengths = torch.full((B,), new_tokens, dtype=torch.long)
    done = torch.zeros(B, dtype=torch.bool)
    steps = 0
    for i in range(new_tokens):
        tok, logp = choose_tokens(logits, temperature, generator)
        if stop_eos:
            tok = tok.masked_fill(done, eos_id)
        tokens[:, i], logprobs[:, i] = tok, logp
        if margins:
            top2 = torch.topk(logits, 2, dim=-1).values
            gaps[:, i] = top2[:, 0] - top2[:, 1]
        if stop_eos:
            ended = ~done & (tok == eos_id)
            lengths[ended] = i + 1
            done |= ended
            if bool(done.all()):
                break
        logits = model.forward_cached(tok[:, None], cache)
        steps += 1
    t2 = time.perf_counter()
    n = lengths.tolist()
    return Generation(tokens=[tokens[b, :n[b]].tolist() for b in range(B)],
                      logprobs=[logprobs[b, :n[b]].tolist() for b in range(B)],
                      stopped=done.tolist(), prefill_seconds=t1 - t0, decode_seconds=t2 - t1,
                      decode_steps=steps, kv_cache_bytes_per_token=cache.bytes_per_token(),
                      margins=[gaps[b, :n[b]].tolist() for b in range(B)] if margins else None)


# =============================================================================================
# Checkpoints and batches
# =============================================================================================

_BIAS_ALIASES = ("mlp.e_score_correction.bias", "mlp.gate.e_score_correction_bias",
                 "mlp.e_score_correction_bias")


def _read_weights(ckpt_dir: str) -> Dict[str, np.ndarray]:
    single = os.path.join(ckpt_dir, "model.safetensors")
    index = os.path.join(ckpt_dir, "model.safetensors.index.json")
    if os.path.exists(single):
        return read_safetensors(single)[0]
    if os.path.exists(index):
        with open(index) as fh:
            wmap = json.load(fh)["weight_map"]
        out: Dict[str, np.ndarray] = {}
        for shard in sorted(set(wmap.values())):
            out.update(read_safetensors(os.path.join(ckpt_dir, shard))[0])
        return out
    raise FileNotFoundError(f"{ckpt_dir}: no model.safetensors")


def load_checkpoint(ckpt_dir: str, dtype: torch.dtype = torch.float64) -> PanguRef:
    """config.json + model.safetensors -> PanguRef in ``dtype``.  Every parameter must be
    present; unknown tensors are errors; a missing selection bias means zero (aliases
    ``mlp.gate.e_score_correction_bias`` / ``mlp.e_score_correction_bias`` are accepted)."""
    with open(os.path.join(ckpt_dir, "config.json")) as fh:
        cfg = json.load(fh)
    model = PanguRef(cfg, dtype=dtype)
    weights = _read_weights(ckpt_dir)
    used = set()
    params = dict(model.named_parameters())
    missing = []
    with torch.no_grad():
        for name, p in params.items():
            if name not in weights:
                missing.append(name)
                continue
            arr = weights[name]
            if tuple(arr.shape) != tuple(p.shape):
                raise ValueError(f"{name}: checkpoint shape {tuple(arr.shape)}, model "
                                 f"{tuple(p.shape)}")
            p.copy_(torch.from_numpy(np.asarray(arr)).to(dtype))
            used.add(name)
        for l in model.bias_layers:
            buf = model.model.layers[l].mlp.e_score_correction.bias
            found = [f"model.layers.{l}.{a}" for a in _BIAS_ALIASES
                     if f"model.layers.{l}.{a}" in weights]
            if len(found) > 1:
                raise ValueError(f"layer {l}: selection bias given twice ({found})")
            if found:
                arr = weights[found[0]]
                if tuple(arr.shape) != tuple(buf.shape):
                    raise ValueError(f"{found[0]}: shape {tuple(arr.shape)}, expected "
                                     f"{tuple(buf.shape)}")
                buf.copy_(torch.from_numpy(np.asarray(arr)).to(dtype))
                used.add(found[0])
            else:
                buf.zero_()
    if missing:
        raise ValueError(f"{ckpt_dir}: checkpoint lacks {len(missing)} tensors: "
                         f"{missing[:8]}{' ...' if len(missing) > 8 else ''}")
    unknown = sorted(set(weights) - used)
    if unknown:
        raise ValueError(f"{ckpt_dir}: unknown tensors in checkpoint: {unknown[:8]}"
                         f"{' ...' if len(unknown) > 8 else ''}")
    return model


def save_checkpoint(model: PanguRef, ckpt_dir: str, dtype: str = "F32") -> None:
    """Write config.json and model.safetensors (parameters + selection biases)."""
    os.makedirs(ckpt_dir, exist_ok=True)
    with open(os.path.join(ckpt_dir, "config.json"), "w") as fh:
        json.dump(model.raw_config, fh, indent=2)
        fh.write("\n")
    tensors = {n: t for n, t in model.state_dict().items()}
    write_safetensors(os.path.join(ckpt_dir, "model.safetensors"), tensors,
                      metadata={"format": "pt"}, dtypes={n: dtype for n in tensors})


@dataclass
class Batch:
    tokens: torch.Tensor       # [B, T] long
    lens: torch.Tensor         # [B] long
    targets: torch.Tensor      # [B, T] long
    weights: torch.Tensor      # [B, T] float64
    temperature: float
    routes: Dict[int, torch.Tensor]   # optional routing replay: layer -> [B, T, K]
    pos: Optional[torch.Tensor] = None  # optional packed rows: [B, T] positions (forward's pos)
    score_weights: Optional[torch.Tensor] = None   # reward model: [B] dL/dscore


def load_batch(path: str) -> Batch:
    t, meta = read_safetensors(path)
    for key in ("tokens", "lens", "targets", "weights"):
        if key not in t:
            raise ValueError(f"{path}: batch lacks tensor '{key}'")
    tokens, lens, targets, weights = t["tokens"], t["lens"], t["targets"], t["weights"]
    if tokens.ndim != 2:
        raise ValueError(f"{path}: tokens must be [B, T]")
    B, T = tokens.shape
    if lens.shape != (B,) or targets.shape != (B, T) or weights.shape != (B, T):
        raise ValueError(f"{path}: expected lens [B], targets and weights [B, T] with B={B}, "
                         f"T={T}")
    routes = {}
    for name, arr in t.items():
        if name.startswith("routes."):
            routes[int(name.split(".", 1)[1])] = torch.from_numpy(arr.astype(np.int64))
    pos = t.get("pos")
    if pos is not None and pos.shape != (B, T):
        raise ValueError(f"{path}: pos must be [B, T] = [{B}, {T}]")
    return Batch(tokens=torch.from_numpy(tokens.astype(np.int64)),
                 lens=torch.from_numpy(lens.astype(np.int64)),
                 targets=torch.from_numpy(targets.astype(np.int64)),
                 weights=torch.from_numpy(weights.astype(np.float64)),
                 temperature=float(meta.get("temperature", "1.0")), routes=routes,
                 pos=None if pos is None else torch.from_numpy(pos.astype(np.int64)),
                 score_weights=(torch.from_numpy(t["score_weights"].astype(np.float64))
                                if "score_weights" in t else None))


def run_reference(model: PanguRef, batch: Batch, route_override: RouteOverride = None,
                  dsa_override: Optional[Mapping[int, torch.Tensor]] = None) -> dict:
    """Forward + backward of ``model`` on ``batch``: logits, logp, losses, routes, gradients
    (a parameter without gradient, e.g. an expert no token reached, gets zeros).  The DSA
    indexers' gradients come from the indexer loss alone, every other one from the loss alone
    (the indexer's input and target are detached, so one backward of their sum does both)."""
    if route_override is None and batch.routes:
        route_override = batch.routes
    model.zero_grad(set_to_none=True)
    out = model.compute_loss(batch.tokens, batch.lens, batch.targets, batch.weights,
                             batch.temperature, route_override, dsa_override,
                             pos=batch.pos, score_weights=batch.score_weights)
    (out.loss + out.index).backward()
    grads = {n: (p.grad.detach().clone() if p.grad is not None else torch.zeros_like(p))
             for n, p in model.named_parameters()}
    fo = out.forward
    return {"logits": fo.logits.detach(), "logp": out.logp.detach(),
            "scores": None if fo.scores is None else fo.scores.detach(),
            "loss": out.loss.detach(), "loss_main": out.main.detach(),
            "loss_balance": out.balance.detach(), "loss_z": out.z.detach(),
            "index_loss": out.index.detach(),
            "dsa": {l: {"scores": d["scores"], "support": d["support"]}
                    for l, d in fo.dsa.items()},
            "valid": fo.valid, "has_target": out.has_target,
            "routes": {l: r.detach() for l, r in fo.routes.items()},
            "natural_routes": {l: r.detach() for l, r in fo.natural_routes.items()},
            "router_keys": {l: (fo.router_scores[l] + model.model.layers[l].mlp.
                                e_score_correction.bias).detach() for l in fo.routes},
            "grads": grads}


# =============================================================================================
# Comparison
# =============================================================================================

def _diff_stats(a: np.ndarray, b: np.ndarray) -> dict:
    """a = prl, b = reference: max |a-b|, ||a-b|| / ||b||, max |b|."""
    a = np.asarray(a, dtype=np.float64).ravel()
    b = np.asarray(b, dtype=np.float64).ravel()
    if a.size == 0:
        return {"max_abs_diff": 0.0, "rel_err": 0.0, "max_abs_ref": 0.0}
    d = a - b
    nd, nb = float(np.linalg.norm(d)), float(np.linalg.norm(b))
    if not np.isfinite(nd):
        rel = float("inf")
    elif nb == 0.0:
        rel = 0.0 if nd == 0.0 else float("inf")
    else:
        rel = nd / nb
    mad = float(np.max(np.abs(d))) if np.all(np.isfinite(d)) else float("inf")
    return {"max_abs_diff": mad, "rel_err": rel, "max_abs_ref": float(np.max(np.abs(b)))}


def check_routes(prl: Mapping[str, np.ndarray], ref: dict, tie_tol: float = 1e-6) -> dict:
    """Compare prl's optional ``routes.{l}`` with the reference's own top-k at valid positions.
    A differing expert set is a near-tie (tolerated) when, slot by slot in rank order, the
    reference keys s+b of the two selections agree within tie_tol*max(1,|key|)."""
    res = {"present": False, "differing_tokens": 0, "near_ties": 0, "order_only": 0,
           "bad": [], "usable": True}
    valid = ref["valid"].cpu().numpy()
    for l, nat in ref["natural_routes"].items():
        name = f"routes.{l}"
        if name not in prl:
            continue
        res["present"] = True
        p = np.asarray(prl[name]).astype(np.int64)
        r = nat.cpu().numpy()
        if p.shape != r.shape:
            res["bad"].append(f"{name}: shape {list(p.shape)} vs {list(r.shape)}")
            res["usable"] = False
            continue
        E = ref["router_keys"][l].shape[-1]
        if ((p < 0) | (p >= E))[valid].any():
            res["bad"].append(f"{name}: expert index out of range")
            res["usable"] = False
            continue
        keys = ref["router_keys"][l].cpu().numpy()
        for b, t in zip(*np.nonzero(valid & np.any(p != r, axis=-1))):
            if sorted(p[b, t]) == sorted(r[b, t]):
                res["order_only"] += 1
                continue
            res["differing_tokens"] += 1
            kp = np.sort(keys[b, t, p[b, t]])[::-1]
            kr = keys[b, t, r[b, t]]
            if np.all(np.abs(kp - kr) <= tie_tol * np.maximum(1.0, np.abs(kr))):
                res["near_ties"] += 1
            else:
                res["bad"].append(f"{name}[{b},{t}]: prl {p[b, t].tolist()} vs reference "
                                  f"{r[b, t].tolist()}")
    return res


def check_dsa(prl: Mapping[str, np.ndarray], ref: dict, tie_tol: float = 1e-6) -> dict:
    """Compare prl's ``dsa_sel.{l}`` [B,T,T] with the reference's selection at valid rows.  A
    row whose set differs is a near-tie (tolerated) when the reference scores of the two sets,
    sorted, agree within tie_tol*max(1,|score|)."""
    res = {"present": False, "differing_rows": 0, "near_ties": 0, "bad": [], "usable": True}
    valid = ref["valid"].cpu().numpy()
    for l, d in ref["dsa"].items():
        name = f"dsa_sel.{l}"
        if name not in prl:
            continue
        res["present"] = True
        p = np.asarray(prl[name]).astype(bool)
        r = d["support"].cpu().numpy()
        if p.shape != r.shape:
            res["bad"].append(f"{name}: shape {list(p.shape)} vs {list(r.shape)}")
            res["usable"] = False
            continue
        sc = d["scores"].cpu().numpy()
        for b, t in zip(*np.nonzero(valid & np.any(p != r, axis=-1))):
            res["differing_rows"] += 1
            sp, sr = np.sort(sc[b, t][p[b, t]]), np.sort(sc[b, t][r[b, t]])
            if sp.shape == sr.shape and np.all(np.abs(sp - sr) <= tie_tol * np.maximum(1.0, np.abs(sr))):
                res["near_ties"] += 1
            else:
                res["bad"].append(f"{name}[{b},{t}]: prl selects {np.nonzero(p[b, t])[0].tolist()} "
                                  f"vs reference {np.nonzero(r[b, t])[0].tolist()}")
    return res


def compare_outputs(ref: dict, prl: Mapping[str, np.ndarray], param_names: Sequence[str],
                    logits_tol: float = 1e-5, grad_tol: float = 1e-4) -> dict:
    """prl outputs vs reference outputs; returns a report dict with 'pass'."""
    failures: List[str] = []
    report: dict = {"tolerances": {"logits": logits_tol, "grad": grad_tol}}
    valid = ref["valid"].cpu().numpy()
    has_t = ref["has_target"].cpu().numpy()
    rl = ref["logits"].cpu().numpy()
    if "logits" not in prl:
        failures.append("logits: missing")
    elif tuple(prl["logits"].shape) != tuple(rl.shape):
        failures.append(f"logits: shape {list(prl['logits'].shape)}, expected {list(rl.shape)}")
    else:
        st = _diff_stats(prl["logits"][valid], rl[valid])
        st["ok"] = bool(st["rel_err"] < logits_tol)
        st["rows_compared"] = int(valid.sum())
        report["logits"] = st
        if not st["ok"]:
            failures.append(f"logits: rel err {st['rel_err']:.3e} >= {logits_tol:g}")
    if ref.get("scores") is not None:   # a reward model's head: checked like the logits
        if "scores" not in prl:
            failures.append("scores: missing")
        else:
            st = _diff_stats(np.asarray(prl["scores"], dtype=np.float64),
                             ref["scores"].cpu().numpy())
            st["ok"] = bool(st["rel_err"] < logits_tol)
            report["scores"] = st
            if not st["ok"]:
                failures.append(f"scores: rel err {st['rel_err']:.3e} >= {logits_tol:g}")
    # informational
    if "loss" in prl:
        pl = np.asarray(prl["loss"], dtype=np.float64).ravel()
        if pl.size == 1:
            report["loss"] = dict(_diff_stats(pl, np.array([float(ref["loss"])])),
                                  prl=float(pl[0]), ref=float(ref["loss"]))
        else:
            report["loss"] = {"error": f"shape {list(prl['loss'].shape)}"}
    if "index_loss" in prl:       # checked: the indexer's gradients are only as good as it
        pl = np.asarray(prl["index_loss"], dtype=np.float64).ravel()
        st = dict(_diff_stats(pl, np.array([float(ref["index_loss"])])),
                  prl=float(pl[0]), ref=float(ref["index_loss"]))
        st["ok"] = bool(st["rel_err"] < grad_tol)
        report["index_loss"] = st
        if not st["ok"]:
            failures.append(f"index_loss: rel err {st['rel_err']:.3e} >= {grad_tol:g}")
    if "logp" in prl:
        if tuple(prl["logp"].shape) == tuple(has_t.shape):
            report["logp"] = _diff_stats(prl["logp"][has_t], ref["logp"].cpu().numpy()[has_t])
        else:
            report["logp"] = {"error": f"shape {list(prl['logp'].shape)}"}
    grads = {}
    prl_grads = {k[5:] for k in prl if k.startswith("grad.")}
    missing = sorted(set(param_names) - prl_grads)
    extra = sorted(prl_grads - set(param_names))
    for name in param_names:
        if name not in prl_grads:
            continue
        a, b = prl["grad." + name], ref["grads"][name].cpu().numpy()
        if tuple(a.shape) != tuple(b.shape):
            grads[name] = {"ok": False, "error": f"shape {list(a.shape)}, expected {list(b.shape)}"}
            failures.append(f"grad.{name}: shape {list(a.shape)}, expected {list(b.shape)}")
            continue
        st = _diff_stats(a, b)
        st["ok"] = bool(st["rel_err"] < grad_tol)
        grads[name] = st
        if not st["ok"]:
            failures.append(f"grad.{name}: rel err {st['rel_err']:.3e} >= {grad_tol:g}")
    failures += [f"grad.{n}: missing" for n in missing]
    failures += [f"grad.{n}: extra (not a parameter)" for n in extra]
    report.update(grads=grads, missing_grads=missing, extra_grads=extra, failures=failures,
                  worst_grad=(max(grads, key=lambda n: grads[n].get("rel_err", float("inf")))
                              if grads else None))
    report["pass"] = not failures
    return report


F32_FLOOR_FACTOR = 4.0


def apply_f32_floor(rep: dict, ref: dict, ref32: dict, prl: Mapping[str, np.ndarray]) -> None:
    """Re-judge the gradients over grad_tol against the reference's own float32 error: one
    passes when ||prl - ref64|| <= F32_FLOOR_FACTOR * ||ref32 - ref64||.  A gradient that is a
    sum with heavy cancellation (a scalar such as an mHC branch_alpha_pre summed over every
    token) cannot be computed to grad_tol in float32 by any implementation; a real bug is far
    above this floor."""
    for name, st in rep["grads"].items():
        if st.get("ok") or "error" in st:
            continue
        b = ref["grads"][name].cpu().numpy().astype(np.float64).ravel()
        floor = float(np.linalg.norm(ref32["grads"][name].cpu().numpy().astype(np.float64).ravel()
                                     - b))
        err = float(np.linalg.norm(np.asarray(prl["grad." + name], dtype=np.float64).ravel() - b))
        st["f32_floor_rel"] = floor / max(float(np.linalg.norm(b)), 1e-300)
        if err <= F32_FLOOR_FACTOR * floor:
            st["ok"] = True
            rep["failures"] = [f for f in rep["failures"] if not f.startswith(f"grad.{name}:")]
    rep["pass"] = not rep["failures"]


def _print_report(rep: dict, out=sys.stdout) -> None:
    def line(status, name, st):
        if "error" in st:
            print(f"{status:4s} {name:64s} {st['error']}", file=out)
        else:
            print(f"{status:4s} {name:64s} max|diff| {st['max_abs_diff']:.3e}  rel "
                  f"{st['rel_err']:.3e}  max|ref| {st['max_abs_ref']:.3e}", file=out)
    if "routes" in rep:
        r = rep["routes"]
        print(f"routes: {r['differing_tokens']} tokens with a different expert set "
              f"({r['near_ties']} near-ties), {r['order_only']} slot-order-only differences; "
              f"using {'prl' if r.get('used_prl') else 'reference'} routes", file=out)
    if "dsa" in rep:
        r = rep["dsa"]
        print(f"dsa: {r['differing_rows']} query rows with a different selection "
              f"({r['near_ties']} near-ties); using {'prl' if r.get('used_prl') else 'reference'} "
              f"selections", file=out)
    if "logits" in rep:
        line("ok" if rep["logits"]["ok"] else "FAIL", "logits", rep["logits"])
    if "scores" in rep:
        line("ok" if rep["scores"]["ok"] else "FAIL", "scores", rep["scores"])
    if "index_loss" in rep:
        line("ok" if rep["index_loss"]["ok"] else "FAIL", "index_loss", rep["index_loss"])
    for k in ("loss", "logp"):
        if k in rep:
            line("info", k, rep[k])
    for name, st in rep["grads"].items():
        line("ok" if st["ok"] else "FAIL", "grad." + name, st)
        if "f32_floor_rel" in st:
            print(f"     (float32 reference's own rel err {st['f32_floor_rel']:.3e}; "
                  f"{'within' if st['ok'] else 'over'} {F32_FLOOR_FACTOR:g}x of it)", file=out)
    if rep["pass"]:
        worst = rep["worst_grad"]
        w = f"; worst grad {worst} rel {rep['grads'][worst]['rel_err']:.3e}" if worst else ""
        floored = [n for n, st in rep["grads"].items() if "f32_floor_rel" in st]
        if floored:
            w += f"; {len(floored)} over it but within the float32 floor ({', '.join(floored)})"
        n_floor = sum("f32_floor_rel" in st for st in rep["grads"].values())
        print(f"PASS: logits rel {rep['logits']['rel_err']:.3e} < "
              f"{rep['tolerances']['logits']:g}; {len(rep['grads']) - n_floor} gradients < "
              f"{rep['tolerances']['grad']:g}{w}", file=out)
    else:
        print(f"FAIL: {len(rep['failures'])} failing tensor(s):", file=out)
        for f in rep["failures"]:
            print(f"  {f}", file=out)


# =============================================================================================
# CLI
# =============================================================================================

_DTYPES = {"float32": torch.float32, "float64": torch.float64}


def _json_default(o):
    if isinstance(o, (np.floating, np.integer)):
        return o.item()
    raise TypeError(type(o))


def _finite_json(obj):
    """JSON has no inf/nan: write them as strings."""
    if isinstance(obj, float) and not math.isfinite(obj):
        return str(obj)
    if isinstance(obj, dict):
        return {k: _finite_json(v) for k, v in obj.items()}
    if isinstance(obj, list):
        return [_finite_json(v) for v in obj]
    return obj


def cmd_compare(args) -> int:
    if args.threads:
        set_threads(args.threads)
    dtype = _DTYPES[args.dtype]
    model = load_checkpoint(args.ckpt, dtype)
    batch = load_batch(args.batch)
    prl = read_safetensors(args.prl)[0]
    ref = run_reference(model, batch)
    ov = None
    route_info = None
    if not batch.routes and any(f"routes.{l}" in prl for l in model.moe_layers):
        route_info = check_routes(prl, ref)
        route_info["used_prl"] = False
        if (route_info["usable"] and not route_info["bad"] and route_info["differing_tokens"]
                and all(f"routes.{l}" in prl for l in model.moe_layers)):
            # Near-ties only: rerun with prl's routes so both sides use the same experts.
            ov = {l: torch.from_numpy(np.asarray(prl[f"routes.{l}"]).astype(np.int64))
                  for l in model.moe_layers}
            ref = run_reference(model, batch, ov)
            route_info["used_prl"] = True
    dsa_info = None
    if any(f"dsa_sel.{l}" in prl for l in model.cfg.dsa_layers):
        dsa_info = check_dsa(prl, ref)
        dsa_info["used_prl"] = False
        if dsa_info["usable"] and not dsa_info["bad"] and dsa_info["differing_rows"]:
            # Near-ties only: rerun with prl's selections so both attend to the same tokens.
            sel = {l: torch.from_numpy(np.asarray(prl[f"dsa_sel.{l}"]).astype(bool))
                   for l in model.cfg.dsa_layers if f"dsa_sel.{l}" in prl}
            ref = run_reference(model, batch, ov if route_info and route_info["used_prl"]
                                else None, sel)
            dsa_info["used_prl"] = True
    rep = compare_outputs(ref, prl, [n for n, _ in model.named_parameters()],
                          args.logits_tol, args.grad_tol)
    if not rep["pass"] and args.dtype == "float64":
        ref32 = run_reference(load_checkpoint(args.ckpt, torch.float32), batch, ov)
        apply_f32_floor(rep, ref, ref32, prl)
    if route_info is not None:
        rep["routes"] = route_info
        if route_info["bad"]:
            rep["failures"] += route_info["bad"]
            rep["pass"] = False
    if dsa_info is not None:
        rep["dsa"] = dsa_info
        if dsa_info["bad"]:
            rep["failures"] += dsa_info["bad"]
            rep["pass"] = False
    rep["dtype"] = args.dtype
    if args.json:
        print(json.dumps(_finite_json(rep), indent=1, default=_json_default))
    else:
        _print_report(rep)
    return 0 if rep["pass"] else 1


def cmd_forward(args) -> int:
    if args.threads:
        set_threads(args.threads)
    model = load_checkpoint(args.ckpt, _DTYPES[args.dtype])
    batch = load_batch(args.batch)
    ref = run_reference(model, batch)
    od = "F32" if args.out_dtype == "float32" else "F64"
    t: Dict[str, object] = {"logits": ref["logits"], "logp": ref["logp"]}
    dtypes = {"logits": od, "logp": od}
    for k in ("loss", "loss_main", "loss_balance", "loss_z"):
        t[k] = ref[k].reshape(1)
        dtypes[k] = "F64"
    for l, r in ref["routes"].items():
        t[f"routes.{l}"] = r
        dtypes[f"routes.{l}"] = "I32"
    for n, g in ref["grads"].items():
        t["grad." + n] = g
        dtypes["grad." + n] = od
    write_safetensors(args.out, t, metadata={"producer": "reference/pangu_ref.py",
                                             "compute_dtype": args.dtype,
                                             "temperature": repr(batch.temperature)},
                      dtypes=dtypes)
    print(f"wrote {args.out}: loss {float(ref['loss']):.17g} (main {float(ref['loss_main']):.6g}, "
          f"balance {float(ref['loss_balance']):.6g}, z {float(ref['loss_z']):.6g}), "
          f"{len(ref['grads'])} gradients")
    return 0


def cmd_init(args) -> int:
    with open(args.config) as fh:
        cfg = json.load(fh)
    model = PanguRef(cfg, dtype=torch.float32)
    gen = torch.Generator().manual_seed(args.seed)
    model.init_weights(args.std, gen)
    if args.random_norms:
        with torch.no_grad():
            for mod in model.modules():
                if isinstance(mod, RMSNorm):
                    mod.weight.uniform_(0.5, 1.5, generator=gen)
            for l in model.bias_layers:
                model.model.layers[l].mlp.e_score_correction.bias.normal_(0.0, 0.01, generator=gen)
    save_checkpoint(model, args.out)
    print(f"wrote {args.out}/config.json and model.safetensors "
          f"({sum(p.numel() for p in model.parameters())} parameters)")
    return 0


def make_batch(vocab: int, B: int, T: int, seed: int, pad: bool = True,
               temperature: float = 1.0) -> Dict[str, np.ndarray]:
    """Random next-token SFT batch: tokens, lens (in [T/2, T] when pad), targets (next token,
    -1 at the last valid position and on padding), weights -mask/sum(mask)."""
    rng = np.random.default_rng(seed)
    tokens = rng.integers(0, vocab, size=(B, T + 1))
    lens = rng.integers(max(1, T // 2), T + 1, size=B) if pad else np.full(B, T)
    pos = np.arange(T)[None, :]
    targets = np.where(pos < lens[:, None] - 1, tokens[:, 1:], -1)
    mask = (targets >= 0).astype(np.float64)
    weights = -mask / max(mask.sum(), 1.0)
    tok = np.where(pos < lens[:, None], tokens[:, :T], 0)
    return {"tokens": tok.astype(np.int32), "lens": lens.astype(np.int32),
            "targets": targets.astype(np.int32), "weights": weights.astype(np.float32)}


def cmd_make_batch(args) -> int:
    with open(args.config) as fh:
        cfg = parse_config(json.load(fh))
    t = make_batch(cfg.vocab_size, args.batch, args.seq, args.seed, not args.no_pad)
    write_safetensors(args.out, t, metadata={"temperature": repr(float(args.temperature))})
    print(f"wrote {args.out}: B={args.batch} T={args.seq} lens={t['lens'].tolist()}")
    return 0


def _openblas():
    """The OpenBLAS library torch's BLAS calls land in (if any), via ctypes."""
    for line in open("/proc/self/maps"):
        path = line.split()[-1] if len(line.split()) >= 6 else ""
        if "openblas" in os.path.basename(path) and ".so" in path:
            try:
                return path, ctypes.CDLL(path)
            except OSError:
                pass
    return None, None


def set_threads(n: int) -> dict:
    """torch intra-op threads AND OpenBLAS's own pthread pool (torch.set_num_threads does not
    reach OpenBLAS), so that --threads N really means N cores of work."""
    torch.set_num_threads(n)
    a = torch.ones(64, 64)
    a @ a                                        # make sure the BLAS library is loaded
    path, lib = _openblas()
    info = {"torch_build_blas": None, "library": path}
    for tok in torch.__config__.show().replace(",", " ").split():
        if tok.startswith("BLAS_INFO="):
            info["torch_build_blas"] = tok.split("=", 1)[1]
    if lib is not None:
        lib.openblas_set_num_threads(ctypes.c_int(n))
        lib.openblas_get_num_threads.restype = ctypes.c_int
        lib.openblas_get_config.restype = ctypes.c_char_p
        lib.openblas_get_corename.restype = ctypes.c_char_p
        info.update(openblas_config=lib.openblas_get_config().decode(),
                    openblas_corename=lib.openblas_get_corename().decode(),
                    openblas_threads=lib.openblas_get_num_threads())
    return info


def _blas_summary(blas: dict) -> str:
    return (f"BLAS_INFO={blas['torch_build_blas']}; {blas.get('library')}; "
            f"{blas.get('openblas_config', '')}; core {blas.get('openblas_corename', '?')}; "
            f"openblas_threads={blas.get('openblas_threads', '?')}")


def cmd_bench(args) -> int:
    blas = set_threads(args.threads)
    with open(args.config) as fh:
        cfg = json.load(fh)
    torch.manual_seed(args.seed)
    gen = torch.Generator().manual_seed(args.seed)
    model = PanguRef(cfg, dtype=torch.float32)
    model.init_weights(None, gen)
    model.train()
    V = model.cfg.vocab_size
    B, T = args.batch, args.seq
    opt = torch.optim.AdamW(model.parameters(), lr=args.lr, betas=(0.9, 0.95), eps=1e-8,
                            weight_decay=0.1, foreach=True)
    # SFT token-mean loss over next-token targets: w_t = -1/N for every target position.
    targets_mask = torch.ones(B, T, dtype=torch.bool)
    targets_mask[:, -1] = False
    weights = torch.where(targets_mask, -1.0 / float(targets_mask.sum()), 0.0)

    def step():
        toks = torch.randint(0, V, (B, T + 1), generator=gen)
        targets = torch.where(targets_mask, toks[:, 1:], torch.full_like(toks[:, 1:], -1))
        t0, c0 = time.perf_counter(), time.process_time()
        opt.zero_grad(set_to_none=True)
        out = model.compute_loss(toks[:, :T], None, targets, weights, 1.0)
        out.loss.backward()
        opt.step()
        if model.cfg.bias_update_rate:
            model.update_selection_bias(out.forward.routes, out.forward.valid)
        return time.perf_counter() - t0, time.process_time() - c0, float(out.loss)

    load_before = os.getloadavg()
    losses = []
    for _ in range(args.warmup):
        losses.append(step()[2])
    times, cpu = [], []
    for _ in range(args.steps):
        dt, dc, loss = step()
        times.append(dt)
        cpu.append(dc)
        losses.append(loss)
    med = statistics.median(times) if times else float("nan")
    blas_str = _blas_summary(blas)
    res = {"tokens_per_s": B * T / med, "step_s_median": med, "step_s_all": times,
           "step_cpu_s_median": statistics.median(cpu) if cpu else float("nan"),
           "threads": args.threads, "torch": torch.__version__, "blas": blas_str,
           "loadavg_before": load_before, "loadavg_after": os.getloadavg(),
           "blas_detail": blas,
           "env": {k: os.environ.get(k) for k in
                   ("OPENBLAS_CORETYPE", "OMP_WAIT_POLICY", "OPENBLAS_THREAD_TIMEOUT",
                    "OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS")},
           "batch": B, "seq": T, "steps": args.steps, "warmup": args.warmup, "seed": args.seed,
           "parameters": sum(p.numel() for p in model.parameters()),
           "loss_first": losses[0] if losses else None, "loss_last": losses[-1] if losses else None,
           "optimizer": f"torch.optim.AdamW(lr={args.lr}, betas=(0.9,0.95), wd=0.1, foreach=True)",
           "parallel_info": torch.__config__.parallel_info()}
    if args.json:
        print(json.dumps(_finite_json(res), indent=1))
    else:
        print(f"{res['tokens_per_s']:.1f} tokens/s, median step {med:.4f} s over {args.steps} "
              f"steps, {args.threads} threads ({blas_str})")
    return 0


def _report_threads(prog: str, blas: dict) -> None:
    """One line on stderr, for the record: torch's thread counts and the BLAS/MKL in use."""
    print(f"{prog}: torch {torch.__version__}, {torch.get_num_threads()} intra-op / "
          f"{torch.get_num_interop_threads()} inter-op threads, MKL "
          f"{'yes' if torch.backends.mkl.is_available() else 'no'}, MKL-DNN "
          f"{'yes' if torch.backends.mkldnn.is_available() else 'no'}, {_blas_summary(blas)}",
          file=sys.stderr)


def load_prompts(path: str, vocab_size: int) -> List[List[int]]:
    """A JSON file holding a list of prompts, each a non-empty list of token ids."""
    with open(path) as fh:
        prompts = json.load(fh)
    if not isinstance(prompts, list) or not all(isinstance(p, list) for p in prompts):
        raise ValueError(f"{path}: expected a JSON list of token-id lists")
    left_pad(prompts, vocab_size)                    # validates
    return prompts


def random_prompts(batch: int, prompt_len: int, vocab_size: int, seed: int) -> List[List[int]]:
    """batch prompts of prompt_len ids drawn uniformly from [16, vocab) (ids below 16 are left
    to special tokens) by a torch.Generator seeded with ``seed``."""
    if vocab_size <= 16:
        raise ValueError(f"vocab_size {vocab_size} leaves no ids in [16, vocab)")
    g = torch.Generator().manual_seed(seed)
    return torch.randint(16, vocab_size, (batch, prompt_len), generator=g).tolist()


def _decode_model(args) -> PanguRef:
    """float32 model from --ckpt, or from --config with a seeded random init (as ``bench``)."""
    if args.ckpt:
        return load_checkpoint(args.ckpt, torch.float32)
    with open(args.config) as fh:
        model = PanguRef(json.load(fh), dtype=torch.float32)
    model.init_weights(None, torch.Generator().manual_seed(args.seed))
    return model


def _decode_round(g: Generation, batch: int, prompt_tokens: int) -> dict:
    decode_tokens = batch * g.decode_steps
    return {"prefill_seconds": g.prefill_seconds, "decode_seconds": g.decode_seconds,
            "prefill_tokens_per_s": prompt_tokens / g.prefill_seconds,
            "decode_tokens_per_s": decode_tokens / g.decode_seconds}


def _check_decode_args(args) -> None:
    if getattr(args, "threads", 0) < 0:
        raise ValueError("--threads must be >= 0")
    for name in ("new_tokens", "rounds", "batch", "prompt_len"):
        v = getattr(args, name, None)
        if v is not None and v < 1:
            raise ValueError(f"--{name.replace('_', '-')} must be >= 1")
    if getattr(args, "warmup", 0) < 0 or getattr(args, "temperature", 0.0) < 0:
        raise ValueError("--warmup and --temperature must be >= 0")


def cmd_bench_decode(args) -> int:
    _check_decode_args(args)
    blas = set_threads(args.threads)
    _report_threads("bench-decode", blas)
    model = _decode_model(args).eval()
    V = model.cfg.vocab_size
    if args.prompts:
        prompts = load_prompts(args.prompts, V)
        if args.batch is not None and args.batch != len(prompts):
            raise ValueError(f"--batch {args.batch} but {args.prompts} holds {len(prompts)} "
                             "prompts")
    else:
        prompts = random_prompts(args.batch or 1, args.prompt_len, V, args.seed)
    B, N = len(prompts), args.new_tokens
    lens = [len(p) for p in prompts]
    load_before = os.getloadavg()
    for _ in range(args.warmup):
        generate(model, prompts, N, args.mla)
    gens = [generate(model, prompts, N, args.mla) for _ in range(args.rounds)]
    rounds = [_decode_round(g, B, sum(lens)) for g in gens]
    prefill_med = statistics.median(r["prefill_seconds"] for r in rounds)
    decode_med = statistics.median(r["decode_seconds"] for r in rounds)
    res = {"batch": B, "prompt_len": max(lens), "new_tokens": N, "threads": args.threads,
           "mla": args.mla, "prefill_seconds_median": prefill_med,
           "decode_seconds_median": decode_med,
           "decode_tokens_per_s_median": B * N / decode_med,
           "prefill_tokens_per_s_median": sum(lens) / prefill_med,
           "rounds": rounds, "kv_cache_bytes_per_token": gens[0].kv_cache_bytes_per_token,
           "torch_version": torch.__version__, "torch_threads": torch.get_num_threads(),
           "dtype": "float32", "prompt_lens": lens, "warmup": args.warmup,
           "model": args.ckpt or args.config, "seed": args.seed,
           "prompts": args.prompts or f"random, seed {args.seed}",
           "tokens_first_sequence": gens[0].tokens[0], "blas": _blas_summary(blas),
           "loadavg_before": load_before, "loadavg_after": os.getloadavg(),
           "env": {k: os.environ.get(k) for k in
                   ("OPENBLAS_CORETYPE", "OMP_WAIT_POLICY", "OMP_NUM_THREADS",
                    "OPENBLAS_NUM_THREADS")}}
    if args.json:
        print(json.dumps(_finite_json(res), indent=1))
    else:
        print(f"{args.mla} MLA, batch {B}, prompt {max(lens)}, {N} new tokens: decode "
              f"{res['decode_tokens_per_s_median']:.1f} tokens/s ({decode_med:.4f} s), prefill "
              f"{prefill_med:.4f} s; medians of {args.rounds} rounds, {args.threads} threads")
    return 0


def cmd_generate(args) -> int:
    _check_decode_args(args)
    if args.threads:
        _report_threads("generate", set_threads(args.threads))
    model = load_checkpoint(args.ckpt, _DTYPES[args.dtype]).eval()
    prompts = load_prompts(args.prompts, model.cfg.vocab_size)
    gen = torch.Generator().manual_seed(args.seed)
    g = generate(model, prompts, args.new_tokens, args.mla, args.temperature, gen,
                 args.stop_eos, args.eos_id, margins=True)
    seqs = [{"prompt_len": len(p), "tokens": t, "logprobs": lp, "margins": m,
             "stopped_at_eos": st}
            for p, t, lp, m, st in zip(prompts, g.tokens, g.logprobs, g.margins, g.stopped)]
    if args.json:
        res = {"mla": args.mla, "dtype": args.dtype, "new_tokens": args.new_tokens,
               "temperature": args.temperature, "stop_eos": args.stop_eos,
               "eos_id": args.eos_id, "sequences": seqs}
        print(json.dumps(_finite_json(res), indent=1))
    else:
        for s in seqs:
            print(" ".join(map(str, s["tokens"])))
            print(" ".join(f"{x:.9g}" for x in s["logprobs"]))
    return 0


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="pangu_ref.py", description=__doc__.split("\n\n")[0])
    sub = p.add_subparsers(dest="cmd", required=True)

    c = sub.add_parser("compare", help="check prl's outputs against the reference")
    c.add_argument("--ckpt", required=True, help="dir with config.json and model.safetensors")
    c.add_argument("--batch", required=True, help="batch safetensors file")
    c.add_argument("--prl", required=True, help="prl's output safetensors file")
    c.add_argument("--dtype", choices=list(_DTYPES), default="float64")
    c.add_argument("--logits-tol", type=float, default=1e-5)
    c.add_argument("--grad-tol", type=float, default=1e-4)
    c.add_argument("--threads", type=int, default=0)
    c.add_argument("--json", action="store_true", help="print the report as JSON")
    c.set_defaults(fn=cmd_compare)

    f = sub.add_parser("forward", help="write the reference's logits, logp, loss, gradients")
    f.add_argument("--ckpt", required=True)
    f.add_argument("--batch", required=True)
    f.add_argument("--out", required=True)
    f.add_argument("--dtype", choices=list(_DTYPES), default="float64",
                   help="compute dtype (default float64)")
    f.add_argument("--out-dtype", choices=list(_DTYPES), default="float32",
                   help="stored dtype of logits/logp/grads (loss is always F64)")
    f.add_argument("--threads", type=int, default=0)
    f.set_defaults(fn=cmd_forward)

    b = sub.add_parser("bench", help="time float32 training steps (the benchmark peer)")
    b.add_argument("--config", required=True)
    b.add_argument("--batch", type=int, default=8)
    b.add_argument("--seq", type=int, default=256)
    b.add_argument("--threads", type=int, default=1)
    b.add_argument("--steps", type=int, default=10)
    b.add_argument("--warmup", type=int, default=2)
    b.add_argument("--seed", type=int, default=0)
    b.add_argument("--lr", type=float, default=1e-4)
    b.add_argument("--json", action="store_true")
    b.set_defaults(fn=cmd_bench)

    d = sub.add_parser("bench-decode", help="time float32 KV-cached greedy decoding (the "
                       "decode benchmark peer)")
    src = d.add_mutually_exclusive_group(required=True)
    src.add_argument("--ckpt", help="dir with config.json and model.safetensors")
    src.add_argument("--config", help="model config; random init seeded by --seed")
    d.add_argument("--batch", type=int, default=None, help="sequences (default 1, or the "
                   "number of --prompts)")
    d.add_argument("--prompt-len", type=int, default=32, help="tokens per random prompt")
    d.add_argument("--prompts", help="JSON list of token-id lists (instead of random prompts)")
    d.add_argument("--new-tokens", type=int, default=64)
    d.add_argument("--threads", type=int, default=1)
    d.add_argument("--rounds", type=int, default=5, help="timed generations")
    d.add_argument("--warmup", type=int, default=1, help="untimed generations first")
    d.add_argument("--mla", choices=MLA_FORMS, default="naive", help="KV-cache form")
    d.add_argument("--seed", type=int, default=0, help="seeds the random init and prompts")
    d.add_argument("--json", action="store_true")
    d.set_defaults(fn=cmd_bench_decode)

    g = sub.add_parser("generate", help="KV-cached generation: new token ids and log-probs "
                       "per prompt (greedy by default; the oracle of prl's decode)")
    g.add_argument("--ckpt", required=True)
    g.add_argument("--prompts", required=True, help="JSON list of token-id lists")
    g.add_argument("--new-tokens", type=int, required=True)
    g.add_argument("--mla", choices=MLA_FORMS, default="naive", help="KV-cache form")
    g.add_argument("--dtype", choices=list(_DTYPES), default="float64")
    g.add_argument("--temperature", type=float, default=0.0, help="0 = greedy (default)")
    g.add_argument("--seed", type=int, default=0, help="sampling generator seed")
    g.add_argument("--stop-eos", action="store_true", help="end a sequence at its first EOS")
    g.add_argument("--eos-id", type=int, default=EOS_ID)
    g.add_argument("--threads", type=int, default=0)
    g.add_argument("--json", action="store_true")
    g.set_defaults(fn=cmd_generate)

    i = sub.add_parser("init", help="write a randomly initialised checkpoint (F32)")
    i.add_argument("--config", required=True)
    i.add_argument("--out", required=True, help="output directory")
    i.add_argument("--seed", type=int, default=0)
    i.add_argument("--std", type=float, default=None, help="default: initializer_range")
    i.add_argument("--random-norms", action="store_true",
                   help="norm gains U(0.5,1.5) and selection biases N(0,0.01) instead of 1 and 0")
    i.set_defaults(fn=cmd_init)

    m = sub.add_parser("make-batch", help="write a random next-token batch file")
    m.add_argument("--config", required=True)
    m.add_argument("--out", required=True)
    m.add_argument("--batch", type=int, default=2)
    m.add_argument("--seq", type=int, default=16)
    m.add_argument("--seed", type=int, default=0)
    m.add_argument("--temperature", type=float, default=1.0)
    m.add_argument("--no-pad", action="store_true", help="all sequences full length")
    m.set_defaults(fn=cmd_make_batch)
    return p


def main(argv: Optional[Sequence[str]] = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return args.fn(args)
    except (SafetensorsError, UnsupportedConfigError, ValueError, FileNotFoundError) as e:
        print(f"pangu_ref.py {args.cmd}: error: {e}", file=sys.stderr)
        return 2
    except BrokenPipeError:                      # e.g. piped into `head`
        sys.stderr.close()
        return 1


if __name__ == "__main__":
    sys.exit(main())
