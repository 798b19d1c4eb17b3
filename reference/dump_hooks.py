#!/usr/bin/env python3
"""Dump the PyTorch reference model's intermediate tensors under prl's hook names, for
``prl diagnose --external DIR`` (docs/diagnose.md, "External dumps").

It loads a checkpoint into ``pangu_ref.PanguRef`` (this directory), registers ordinary
``nn.Module`` forward hooks, runs the full-sequence forward of each sequence (batch 1) and
writes ``OUT/seq-<i>.safetensors`` for the i-th sequence (0-based, in input order) holding

* ``tokens``                 I32 [T]          the sequence (prl checks it is the same one);
* ``L<l>.attn.q``            [T, H*(dn+dr)]   q_b_proj output with RoPE applied to each
                                              head's rope part (prl's query);
* ``L<l>.attn.kv_latent``    [T, r_kv]        kv_a_layernorm output (the normalised c_kv);
* ``L<l>.attn.out``          [T, d]           o_proj output;
* ``L<l>.mlp.out``           [T, d]           the dense SwiGLU's output (dense layers);
* ``L<l>.moe.router_logits`` [T, N_r]         the router's logits (before the sigmoid);
* ``L<l>.moe.out``           [T, d]           shared + routed experts' output;
* ``L<l>.moe.routes``        I32 [T, K]       the experts it selected (for routing overlap);
* ``final.logits``           [T, V]           lm_head output.

Float tensors are stored in ``--out-dtype`` (default F32). Another engine can produce the same
layout with its own hooks; nothing here is specific to PyTorch but the module names.

Sequences: ``--jsonl FILE`` (lines with ``"ids"``, as ``prl diagnose --jsonl`` reads them; text
lines need prl's tokenizer, so give ids) or ``--run runs/NAME --step S`` (the samples of step S
in run.db, ordered by prompt id and sample index as prl reads them), at most ``--n`` of them.

``--fault NAME:REL`` scales one op's output by (1 + REL) inside the forward (a forward hook that
returns the changed output), so the error propagates: a negative control for the comparison.

Run it with Debian's Python, which has torch::

    /usr/bin/python3 reference/dump_hooks.py --ckpt CKPT --jsonl seqs.jsonl --out DUMP
    prl diagnose --ckpt CKPT --jsonl seqs.jsonl --external DUMP
"""

from __future__ import annotations

import argparse
import json
import os
import sqlite3
import sys
from typing import Dict, List, Optional, Tuple

import numpy as np
import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import pangu_ref  # noqa: E402


def read_jsonl(path: str, n: int) -> List[List[int]]:
    seqs = []
    with open(path) as fh:
        for lineno, line in enumerate(fh, 1):
            if len(seqs) >= n:
                break
            if not line.strip():
                continue
            try:
                obj = json.loads(line)
            except json.JSONDecodeError as e:
                raise SystemExit(f"{path}:{lineno}: invalid JSON: {e}")
            ids = obj.get("ids") if isinstance(obj, dict) else None
            if not isinstance(ids, list) or not ids or not all(isinstance(i, int) for i in ids):
                raise SystemExit(f"{path}:{lineno}: a line needs a non-empty \"ids\" list of "
                                 "token ids (text needs prl's tokenizer: give ids)")
            seqs.append(ids)
    return seqs


def read_run(run_dir: str, step: int, n: int) -> List[List[int]]:
    name = os.path.basename(os.path.normpath(run_dir))
    db = sqlite3.connect(f"file:{os.path.join(run_dir, 'run.db')}?mode=ro", uri=True)
    rows = db.execute(
        "SELECT s.tokens FROM samples s JOIN runs r ON s.run = r.id WHERE r.name = ? AND "
        "s.step = ? ORDER BY s.prompt_id, s.sample_index LIMIT ?", (name, step, n)).fetchall()
    db.close()
    if not rows:
        raise SystemExit(f"{run_dir}: run {name} has no samples at step {step}")
    return [np.frombuffer(r[0], dtype="<i4").astype(np.int64).tolist() for r in rows]


class HookDump:
    """Forward hooks on a PanguRef that record prl's hook tensors of one forward (batch 1)."""

    def __init__(self, model: pangu_ref.PanguRef, fault: Optional[Tuple[str, float]]):
        self.model, self.fault = model, fault
        self.out: Dict[str, np.ndarray] = {}
        self.T = 0
        self.handles = []
        self.names = ["tokens"]
        for l, layer in enumerate(model.model.layers):
            attn = layer.self_attn
            self._hook(attn.q_b_proj, f"L{l}.attn.q", self._query(attn))
            self._hook(attn.kv_a_layernorm, f"L{l}.attn.kv_latent", lambda y: y[0], only_3d=True)
            self._hook(attn.o_proj, f"L{l}.attn.out", lambda y: y[0])
            if layer.is_moe:
                self._hook(layer.mlp.gate, f"L{l}.moe.router_logits", lambda y: y)
                self._hook(layer.mlp, f"L{l}.moe.out", None)
            else:
                self._hook(layer.mlp, f"L{l}.mlp.out", lambda y: y[0])
        self._hook(model.lm_head, "final.logits", lambda y: y[0])

    def _query(self, attn):
        """q_b_proj output [1,T,H*dq] -> prl's query: RoPE on each head's rope part."""
        def convert(y):
            T = y.shape[1]
            cos, sin = self.model._rope(T, y.device)
            q = y[0].view(T, attn.H, attn.dn + attn.dr)
            rope = pangu_ref.apply_rope(q[..., attn.dn:], cos.unsqueeze(-2), sin.unsqueeze(-2))
            return torch.cat([q[..., :attn.dn], rope], dim=-1).reshape(T, -1)
        return convert

    def _hook(self, module, name, convert, only_3d=False):
        self.names.append(name)
        if convert is None:
            self.names.append(name.replace(".out", ".routes"))
        def hook(mod, inputs, output):
            if only_3d and output.dim() != 3:   # kv_a_layernorm also normalises the sinks
                return None
            scale = None
            if self.fault and self.fault[0] == name:
                scale = 1.0 + self.fault[1]
            if isinstance(output, pangu_ref.MoEOutput):
                if scale is not None:
                    output.y = output.y * scale
                self.out[name] = output.y.detach()
                self.out[name.replace(".out", ".routes")] = output.sel.detach().to(torch.int32)
                return output
            if scale is not None:
                output = output * scale
            self.out[name] = convert(output).detach()
            return output if scale is not None else None
        self.handles.append(module.register_forward_hook(hook))

    def run(self, ids: List[int]) -> Dict[str, np.ndarray]:
        self.out = {}
        with torch.no_grad():
            self.model(torch.tensor([ids], dtype=torch.long))
        return {k: v.cpu().numpy() for k, v in self.out.items()}


def parse_fault(text: Optional[str]) -> Optional[Tuple[str, float]]:
    if not text:
        return None
    name, sep, rel = text.rpartition(":")
    try:
        value = float(rel)
    except ValueError:
        value = 0.0
    if not sep or not name or value == 0.0:
        raise SystemExit(f"--fault {text!r}: expected NAME:REL with REL != 0, e.g. L2.attn.out:0.01")
    return name, value


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--ckpt", required=True, help="checkpoint directory (config.json, model.safetensors)")
    src = ap.add_mutually_exclusive_group(required=True)
    src.add_argument("--jsonl", help="JSONL with {\"ids\": [...]} lines")
    src.add_argument("--run", help="run directory runs/NAME (with --step)")
    ap.add_argument("--step", type=int, help="--run: the step whose samples to dump")
    ap.add_argument("--n", type=int, default=8, help="at most N sequences (default 8, as prl diagnose)")
    ap.add_argument("--out", required=True, help="output directory (created)")
    ap.add_argument("--dtype", choices=["float64", "float32"], default="float64",
                    help="the reference's compute dtype (default float64)")
    ap.add_argument("--out-dtype", choices=["F32", "F64"], default="F32", help="stored float dtype")
    ap.add_argument("--fault", help="NAME:REL: scale op NAME by (1 + REL) (a negative control)")
    args = ap.parse_args(argv)
    if args.run and args.step is None:
        ap.error("--run needs --step (pass the same step to prl diagnose)")
    if args.n < 1:
        ap.error("--n must be >= 1")
    fault = parse_fault(args.fault)
    seqs = read_jsonl(args.jsonl, args.n) if args.jsonl else read_run(args.run, args.step, args.n)
    model = pangu_ref.load_checkpoint(args.ckpt, getattr(torch, args.dtype))
    model.eval()
    V = model.cfg.vocab_size
    for i, ids in enumerate(seqs):
        bad = [t for t in ids if not 0 <= t < V]
        if bad:
            raise SystemExit(f"sequence {i}: token id {bad[0]} out of the vocabulary [0, {V})")
    dump = HookDump(model, fault)
    if fault and fault[0] not in dump.names[1:]:
        raise SystemExit(f"--fault {fault[0]}: no such op in this model (ops: "
                         f"{', '.join(n for n in dump.names[1:] if not n.endswith('.routes'))})")
    os.makedirs(args.out, exist_ok=True)
    np_float = np.float32 if args.out_dtype == "F32" else np.float64
    for i, ids in enumerate(seqs):
        tensors = {}
        for name, arr in dump.run(ids).items():
            tensors[name] = arr.astype(np.int32) if arr.dtype == np.int32 else arr.astype(np_float)
        tensors["tokens"] = np.asarray(ids, dtype=np.int32)
        pangu_ref.write_safetensors(os.path.join(args.out, f"seq-{i}.safetensors"), tensors,
                                    metadata={"engine": "reference/pangu_ref.py",
                                              "dtype": args.dtype,
                                              "fault": args.fault or ""})
    print(f"dump_hooks: {len(seqs)} sequences -> {args.out}/seq-<i>.safetensors", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
