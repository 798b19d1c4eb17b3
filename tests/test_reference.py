#!/usr/bin/env python3
"""Self-test of the PyTorch reference (reference/pangu_ref.py); runs without prl.

    /usr/bin/python3 tests/test_reference.py          (plain unittest; -v for names)

What it checks:
* autograd vs central finite differences of the full loss (float64, micro config, aux losses
  and temperature on, routes frozen with route_override), plus a negative control showing the
  check catches a wrong gradient;
* the model against a second, deliberately naive implementation written here from
  docs/model.md (per sequence, per token, per head loops; Python tie-breaking for top-k);
* RoPE properties (norm preserving, position 0 is the identity, half-split pairing, relative
  position, cos/sin rounded once from float64);
* MoE top-k ties (lower index wins), route_override, selection-bias update rules;
* padding positions change nothing; unsupported config keys raise naming the key;
* safetensors round trip, byte-exact layout, and rejection of malformed files;
* KV-cached generation, both MLA cache forms: greedy tokens and log-probs equal those of a
  loop that recomputes the full forward per step (left-padded batch of different prompt
  lengths), negative controls (a broken cache is caught), naive vs absorbed logits, EOS stop,
  seeded sampling;
* the CLI end to end (init, make-batch, forward, compare pass/fail, bench and bench-decode
  smoke, generate against the no-cache oracle).

Longer than ~800 lines on purpose: one unittest module for the one reference file, whose cases
share the configs and helpers at its top.
"""

import copy
import json
import math
import os
import subprocess
import sys
import tempfile
import unittest
from unittest import mock

import numpy as np
import torch
import torch.nn.functional as F

HERE = os.path.dirname(os.path.abspath(__file__))
REF_DIR = os.path.join(os.path.dirname(HERE), "reference")
REF_PY = os.path.join(REF_DIR, "pangu_ref.py")
sys.path.insert(0, REF_DIR)

import pangu_ref as pr  # noqa: E402

PY = sys.executable

MICRO = {
    "vocab_size": 64, "hidden_size": 32, "num_hidden_layers": 3, "num_attention_heads": 2,
    "q_lora_rank": 16, "kv_lora_rank": 16, "qk_nope_head_dim": 8, "qk_rope_head_dim": 4,
    "v_head_dim": 8, "rope_theta": 10000.0, "rope_interleave": False, "rms_norm_eps": 1e-5,
    "first_k_dense_replace": 1, "intermediate_size": 64, "n_routed_experts": 4,
    "num_experts_per_tok": 2, "moe_intermediate_size": 16, "n_shared_experts": 1,
    "norm_topk_prob": True, "routed_scaling_factor": 1.0, "max_position_embeddings": 16,
    "tie_word_embeddings": False, "initializer_range": 0.02,
}


# The micro config's attention blocks (spec §12.2): layers 1 and 2 slide with W = 4 (the
# batches have 8 positions), two parameter sinks per layer, ModAttn convs with k = 3.
BLOCKS = dict(MICRO, swa_layers=[1, 2], sliding_window_list=[4, 4], sliding_window=4,
              param_sink_number=2, param_sink_with_value=True, use_mome=True,
              router_sliding_window=3)

# BLOCKS plus mHC (4 streams, 3 Sinkhorn iterations, gamma), sandwich norms and a block
# post-norm after layer 0 (spec §12.2 without DSA and MTP).
MHC = dict(BLOCKS, use_mhc=True, mhc_num_stream=4, mhc_recur_norm=3, mhc_use_gamma=True,
           sandwich_norm=True, block_post_layernorm_idx=[0])


def micro_model(cfg=None, seed=0, std=0.3, dtype=torch.float64):
    """A float64 model with non-trivial weights: N(0, std) linears, random norm gains and
    selection biases (so every gradient path is exercised)."""
    model = pr.PanguRef(cfg or MICRO, dtype=dtype)
    g = torch.Generator().manual_seed(seed)
    model.init_weights(std, g)
    with torch.no_grad():
        for m in model.modules():
            if isinstance(m, pr.RMSNorm):
                m.weight.uniform_(0.5, 1.5, generator=g)
            elif isinstance(m, torch.nn.Conv1d):     # init 0 is the identity: perturb
                m.weight.normal_(0.0, 0.3, generator=g)
            elif isinstance(m, pr.MHCModule):        # alpha 0.01, b_res -8: nearly flat
                for name, p in m.named_parameters():
                    if "branch_" in name:
                        p.add_(torch.randn(p.shape, generator=g, dtype=p.dtype) * 0.5)
        for l in model.moe_layers:
            model.model.layers[l].mlp.e_score_correction.bias.normal_(0.0, 0.05, generator=g)
    return model


def micro_batch(B=3, T=8, lens=(8, 5, 6), seed=1, vocab=64):
    g = torch.Generator().manual_seed(seed)
    tokens = torch.randint(0, vocab, (B, T), generator=g)
    lens = torch.tensor(lens)
    targets = torch.randint(0, vocab, (B, T), generator=g)
    targets[0, 2] = -1                               # a valid position without a target
    targets[1, 4] = -1
    weights = torch.randn(B, T, generator=g, dtype=torch.float64)
    return tokens, lens, targets, weights


# ---------------------------------------------------------------------------------------------
# A second, naive implementation of docs/model.md (loops; nothing shared with pangu_ref except
# the parameter names).
# ---------------------------------------------------------------------------------------------

def naive_loss(sd, cfg, tokens, lens, targets, weights, tau, routes=None):
    """Returns (loss, {b: logits [len_b, V]}, {layer: [[sel per valid token] per seq]})."""
    d, H = cfg["hidden_size"], cfg["num_attention_heads"]
    dn, dr, dv = cfg["qk_nope_head_dim"], cfg["qk_rope_head_dim"], cfg["v_head_dim"]
    rkv = cfg["kv_lora_rank"]
    E, K = cfg.get("n_routed_experts", 0), cfg.get("num_experts_per_tok", 0)
    eps = cfg["rms_norm_eps"]
    alpha = cfg.get("prl_balance_loss_alpha", 0.0)
    beta = cfg.get("prl_router_z_loss_coef", 0.0)
    theta = cfg["rope_theta"]

    def rms(x, g, e):
        return g * x / math.sqrt(float((x * x).mean()) + e)

    def rope(x, pos):
        half = x.shape[0] // 2
        y = x.clone()
        for i in range(half):
            ang = pos * theta ** (-2.0 * i / dr)
            c, s = math.cos(ang), math.sin(ang)
            y[i] = x[i] * c - x[i + half] * s
            y[i + half] = x[i + half] * c + x[i] * s
        return y

    def swiglu(x, pre):
        gt = sd[pre + "gate_proj.weight"] @ x
        up = sd[pre + "up_proj.weight"] @ x
        return sd[pre + "down_proj.weight"] @ (gt * torch.sigmoid(gt) * up)

    # sliding windows (0 = causal) and parameter sinks, straight from the config keys
    windows = [0] * cfg["num_hidden_layers"]
    for i, l in enumerate(cfg.get("swa_layers") or []):
        windows[l] = (cfg.get("sliding_window_list") or [cfg.get("sliding_window")] * (i + 1))[i]
    ns = cfg.get("param_sink_number", 0)
    k_conv = cfg.get("router_sliding_window", 0) if cfg.get(
        "use_mome", cfg.get("router_sliding_window", 0) > 0) else 0

    def conv(xs, name):
        """ModAttn: x_t + sum_j w[c,0,j] x_{t-(k-1)+j}, nothing before the first token."""
        if k_conv == 0:
            return xs
        w = sd[name][:, 0, :]
        return [xs[t] + sum(w[:, j] * xs[t - (k_conv - 1) + j] for j in range(k_conv)
                            if t - (k_conv - 1) + j >= 0) for t in range(len(xs))]

    def sinks(p):
        """Per sink i and head: key [k_nope ; k_pe] and value, built like a token's."""
        out = []
        for i in range(ns):
            if cfg.get("param_sink_with_value", True):
                c = rms(sd[p + "self_attn.param_sink_compressed_kv"][i],
                        sd[p + "self_attn.kv_a_layernorm.weight"], 1e-6)
            else:
                c = torch.zeros(rkv, dtype=torch.float64)
            kv = (sd[p + "self_attn.kv_b_proj.weight"] @ c).view(H, dn + dv)
            kpe = sd[p + "self_attn.param_sink_k_pe"][i]
            out.append(([torch.cat([kv[hh, :dn], kpe]) for hh in range(H)],
                        [kv[hh, dn:] for hh in range(H)]))
        return out

    B = tokens.shape[0]
    loss = torch.zeros((), dtype=torch.float64)
    logits_out, routes_out = {}, {}
    bal = torch.zeros((), dtype=torch.float64)
    zsum = {}
    n_valid = int(sum(int(x) for x in lens))
    for b in range(B):
        Tb = int(lens[b])
        h = [sd["model.embed_tokens.weight"][int(tokens[b, t])] for t in range(Tb)]
        for l in range(cfg["num_hidden_layers"]):
            p = f"model.layers.{l}."
            a = [rms(x, sd[p + "input_layernorm.weight"], eps) for x in h]
            qs, ks, vs = [], [], []
            zq = [sd[p + "self_attn.q_a_proj.weight"] @ a[t] for t in range(Tb)]
            kvas = [sd[p + "self_attn.kv_a_proj_with_mqa.weight"] @ a[t] for t in range(Tb)]
            zq = conv(zq, p + "self_attn.qa_conv.weight")
            ckvs = conv([x[:rkv] for x in kvas], p + "self_attn.compresskv_conv.weight")
            for t in range(Tb):
                cq = rms(zq[t], sd[p + "self_attn.q_a_layernorm.weight"], 1e-6)
                q = (sd[p + "self_attn.q_b_proj.weight"] @ cq).view(H, dn + dr)
                kva = kvas[t]
                ckv = rms(ckvs[t], sd[p + "self_attn.kv_a_layernorm.weight"], 1e-6)
                kr = rope(kva[rkv:], t)
                kv = (sd[p + "self_attn.kv_b_proj.weight"] @ ckv).view(H, dn + dv)
                qs.append([torch.cat([q[hh, :dn], rope(q[hh, dn:], t)]) for hh in range(H)])
                ks.append([torch.cat([kv[hh, :dn], kr]) for hh in range(H)])
                vs.append([kv[hh, dn:] for hh in range(H)])
            new_h, os_ = [], []
            sk = sinks(p)
            for t in range(Tb):
                o = []
                seen = [s for s in range(t + 1) if windows[l] == 0 or t - s < windows[l]]
                for hh in range(H):
                    keys = [k[hh] for k, _ in sk] + [ks[s][hh] for s in seen]
                    vals = [v[hh] for _, v in sk] + [vs[s][hh] for s in seen]
                    sc = torch.stack([(qs[t][hh] @ k) / math.sqrt(dn + dr) for k in keys])
                    pw = torch.softmax(sc, 0)
                    o.append(sum(pw[j] * vals[j] for j in range(len(keys))))
                os_.append(torch.cat(o))
            os_ = conv(os_, p + "self_attn.o_conv.weight")
            new_h = [h[t] + sd[p + "self_attn.o_proj.weight"] @ os_[t] for t in range(Tb)]
            h = new_h
            f = [rms(x, sd[p + "post_attention_layernorm.weight"], eps) for x in h]
            if l < cfg.get("first_k_dense_replace", 0):
                h = [h[t] + swiglu(f[t], p + "mlp.") for t in range(Tb)]
                continue
            bias = sd.get(p + "mlp.e_score_correction.bias", torch.zeros(E, dtype=torch.float64))
            sel_b, cnt, Psum = [], [0.0] * E, torch.zeros(E, dtype=torch.float64)
            for t in range(Tb):
                u = f[t]
                z = sd[p + "mlp.gate.weight"] @ u
                s = torch.sigmoid(z)
                if routes is not None:
                    sel = [int(e) for e in routes[l][b][t]]
                else:
                    key = [float(s[i] + bias[i]) for i in range(E)]
                    sel = sorted(range(E), key=lambda i: (-key[i], i))[:K]
                sel_b.append(sel)
                ssum = sum(s[i] for i in sel)
                y = torch.zeros(d, dtype=torch.float64)
                for i in sel:
                    g = s[i] / (ssum + 1e-20) if cfg.get("norm_topk_prob", True) else s[i]
                    y = y + cfg.get("routed_scaling_factor", 1.0) * g * swiglu(
                        u, p + f"mlp.experts.{i}.")
                if cfg.get("n_shared_experts", 0) > 0:
                    y = y + swiglu(u, p + "mlp.shared_experts.")
                h[t] = h[t] + y
                for i in set(sel):
                    cnt[i] += 1.0
                Psum = Psum + s / s.sum()
                zsum[l] = zsum.get(l, 0.0) + torch.logsumexp(z, 0) ** 2
            routes_out.setdefault(l, []).append(sel_b)
            if Tb > 0:
                fi = torch.tensor([E / (K * Tb) * c for c in cnt], dtype=torch.float64)
                bal = bal + alpha * (fi * (Psum / Tb)).sum() / B
        lg = torch.stack([sd["lm_head.weight"] @ rms(x, sd["model.norm.weight"], eps)
                          for x in h]) if Tb else torch.zeros(0, cfg["vocab_size"])
        logits_out[b] = lg
        for t in range(Tb):
            if int(targets[b, t]) >= 0:
                lp = torch.log_softmax(lg[t] / tau, 0)[int(targets[b, t])]
                loss = loss + weights[b, t] * lp
    zl = sum(beta * v / n_valid for v in zsum.values()) if zsum else 0.0
    return loss + bal + zl, logits_out, routes_out


# ---------------------------------------------------------------------------------------------

class TestNaiveAgreement(unittest.TestCase):
    """The efficient model equals the loop implementation of docs/model.md (float64)."""

    def check(self, cfg, lens=(8, 5, 6), tau=0.7, use_routes=False):
        model = micro_model(cfg, seed=3)
        tokens, lens_t, targets, weights = micro_batch(lens=lens)
        sd = {n: t.detach().clone() for n, t in model.state_dict().items()}
        override = None
        if use_routes:
            # arbitrary routes that differ from the natural ones
            g = torch.Generator().manual_seed(9)
            E, K = cfg["n_routed_experts"], cfg["num_experts_per_tok"]
            override = {l: torch.stack([torch.randperm(E, generator=g)[:K]
                                        for _ in range(tokens.numel())]).view(*tokens.shape, K)
                        for l in model.moe_layers}
        out = model.compute_loss(tokens, lens_t, targets, weights, tau, override)
        routes_naive = None
        if override is not None:
            routes_naive = {l: [[override[l][b, t].tolist() for t in range(int(lens_t[b]))]
                                for b in range(tokens.shape[0])] for l in override}
        loss_n, logits_n, routes_n = naive_loss(sd, cfg, tokens, lens_t, targets, weights, tau,
                                                routes_naive)
        self.assertTrue(torch.allclose(out.loss, loss_n, rtol=1e-11, atol=1e-12),
                        f"loss {float(out.loss)!r} vs naive {float(loss_n)!r}")
        for b in range(tokens.shape[0]):
            Tb = int(lens_t[b])
            if Tb == 0:
                continue
            a = out.forward.logits[b, :Tb]
            self.assertLess(float((a - logits_n[b]).norm() / logits_n[b].norm()), 1e-12)
            for l in model.moe_layers:
                got = out.forward.routes[l][b, :Tb].tolist()
                self.assertEqual(got, routes_n[l][b], f"routes layer {l} seq {b}")
        return out

    def test_default_micro_with_aux_losses(self):
        cfg = dict(MICRO, prl_balance_loss_alpha=0.03, prl_router_z_loss_coef=0.01)
        out = self.check(cfg)
        self.assertGreater(float(out.balance), 0.0)
        self.assertGreater(float(out.z), 0.0)

    def test_all_moe_no_shared_no_renorm_scaled(self):
        cfg = dict(MICRO, first_k_dense_replace=0, n_shared_experts=0, norm_topk_prob=False,
                   routed_scaling_factor=2.5, num_experts_per_tok=3,
                   prl_balance_loss_alpha=0.1)
        self.check(cfg, tau=1.3)

    def test_route_override(self):
        cfg = dict(MICRO, prl_balance_loss_alpha=0.05, prl_router_z_loss_coef=0.02)
        self.check(cfg, use_routes=True)

    def test_empty_sequence_in_batch(self):
        cfg = dict(MICRO, prl_balance_loss_alpha=0.05, prl_router_z_loss_coef=0.02)
        self.check(cfg, lens=(8, 0, 3))

    def test_sliding_windows_and_sinks(self):
        self.check(BLOCKS)
        self.check(dict(BLOCKS, swa_layers=[0, 2], sliding_window_list=[2, 3],
                        param_sink_number=3, param_sink_with_value=False,
                        router_sliding_window=2), lens=(8, 2, 6))

    def test_window_and_sinks_change_the_model(self):
        """Negative controls: the blocks are really on (the loss moves when either is off)."""
        tokens, lens, targets, weights = micro_batch()
        loss = {}
        for name, cfg in (("both", BLOCKS), ("no window", dict(BLOCKS, swa_layers=[], sliding_window_list=[])),
                          ("no sinks", dict(BLOCKS, param_sink_number=0)),
                          ("no conv", dict(BLOCKS, use_mome=False))):
            m = micro_model(cfg, seed=3)
            loss[name] = float(m.compute_loss(tokens, lens, targets, weights, 0.7).loss)
        self.assertGreater(abs(loss["both"] - loss["no window"]), 1e-6)
        self.assertGreater(abs(loss["both"] - loss["no sinks"]), 1e-6)
        self.assertGreater(abs(loss["both"] - loss["no conv"]), 1e-6)


class TestGradients(unittest.TestCase):
    """autograd vs central finite differences of the loss, float64, routes frozen."""

    CFG = dict(MICRO, prl_balance_loss_alpha=0.05, prl_router_z_loss_coef=0.02)

    def setUp(self):
        self.model = micro_model(self.CFG, seed=5)
        self.batch = micro_batch(lens=(8, 5, 7), seed=6)
        tokens, lens, targets, weights = self.batch
        with torch.no_grad():
            out = self.model(tokens, lens)
        self.routes = {l: r.clone() for l, r in out.routes.items()}   # frozen routing

    def loss(self):
        tokens, lens, targets, weights = self.batch
        return self.model.compute_loss(tokens, lens, targets, weights, 0.7, self.routes).loss

    def autograd(self):
        self.model.zero_grad(set_to_none=True)
        self.loss().backward()
        return {n: (p.grad.clone() if p.grad is not None else torch.zeros_like(p))
                for n, p in self.model.named_parameters()}

    def fd_failures(self, grads, eps=1e-4, rtol=1e-7, atol=1e-9, entries_per_tensor=2):
        """Per parameter tensor: a random-direction derivative, plus a few single entries.
        Central differences at eps and eps/2 combined by Richardson extrapolation (error
        O(eps^4)), so a tight tolerance holds even where the loss is strongly curved."""

        def central(p, v, h):
            p.add_(v, alpha=h)
            lp = float(self.loss())
            p.add_(v, alpha=-2 * h)
            lm = float(self.loss())
            p.add_(v, alpha=h)
            return (lp - lm) / (2 * h)

        g = torch.Generator().manual_seed(11)
        failures = []
        params = dict(self.model.named_parameters())
        with torch.no_grad():
            for name, p in params.items():
                dirs = [torch.randn(p.shape, generator=g, dtype=p.dtype)]
                flat_idx = torch.randint(0, p.numel(), (entries_per_tensor,), generator=g)
                for i in flat_idx.tolist():
                    e = torch.zeros(p.numel(), dtype=p.dtype)
                    e[i] = 1.0
                    dirs.append(e.view(p.shape))
                for v in dirs:
                    fd = (4 * central(p, v, eps / 2) - central(p, v, eps)) / 3
                    an = float((grads[name] * v).sum())
                    if abs(fd - an) > atol + rtol * max(abs(fd), abs(an)):
                        failures.append(f"{name}: fd {fd:.12e} autograd {an:.12e}")
        return failures

    def test_autograd_matches_finite_differences(self):
        grads = self.autograd()
        # every parameter really gets gradient in this setup
        for n, gr in grads.items():
            self.assertGreater(float(gr.abs().max()), 0.0, f"{n} has zero gradient")
        failures = self.fd_failures(grads)
        self.assertEqual(failures, [], "\n".join(failures))

    def test_finite_difference_check_catches_a_wrong_gradient(self):
        grads = self.autograd()
        bad = dict(grads)
        bad["model.layers.1.self_attn.q_b_proj.weight"] = grads[
            "model.layers.1.self_attn.q_b_proj.weight"] * 1.01
        bad["model.layers.2.mlp.gate.weight"] = grads["model.layers.2.mlp.gate.weight"].flip(0)
        failures = self.fd_failures(bad, entries_per_tensor=0)
        names = {f.split(":")[0] for f in failures}
        self.assertIn("model.layers.1.self_attn.q_b_proj.weight", names)
        self.assertIn("model.layers.2.mlp.gate.weight", names)

    def test_sink_parameters_get_gradient(self):
        grads = self.autograd()
        for n, gr in grads.items():
            if "param_sink" in n:
                self.assertGreater(float(gr.abs().max()), 0.0, n)

    def test_route_override_equal_to_natural_changes_nothing(self):
        tokens, lens, targets, weights = self.batch
        a = self.model.compute_loss(tokens, lens, targets, weights, 0.7, None)
        b = self.model.compute_loss(tokens, lens, targets, weights, 0.7, self.routes)
        seq = [self.routes[l] for l in self.model.moe_layers]
        c = self.model.compute_loss(tokens, lens, targets, weights, 0.7, seq)
        flat = {l: r.reshape(-1, r.shape[-1]) for l, r in self.routes.items()}
        d = self.model.compute_loss(tokens, lens, targets, weights, 0.7, flat)
        for o in (b, c, d):
            self.assertEqual(float(a.loss), float(o.loss))


class TestGradientsBlocks(TestGradients):
    """The same checks with sliding windows and parameter sinks on."""

    CFG = dict(BLOCKS, prl_balance_loss_alpha=0.05, prl_router_z_loss_coef=0.02)
    test_finite_difference_check_catches_a_wrong_gradient = None
    test_route_override_equal_to_natural_changes_nothing = None


class TestGradientsMHC(TestGradients):
    """The same checks with mHC, sandwich norms and a block post-norm on top of BLOCKS."""

    CFG = dict(MHC, prl_balance_loss_alpha=0.05, prl_router_z_loss_coef=0.02)
    test_finite_difference_check_catches_a_wrong_gradient = None
    test_route_override_equal_to_natural_changes_nothing = None


class TestMHC(unittest.TestCase):
    """Sinkhorn and the mHC site against the spec's equations written out per element."""

    def test_sinkhorn_order_and_doubly_stochastic(self):
        g = torch.Generator().manual_seed(1)
        R = torch.randn(4, 4, generator=g, dtype=torch.float64) * 2
        eps = 1e-6
        M = [[0.0] * 4 for _ in range(4)]
        for i in range(4):
            e = [math.exp(float(R[i, j])) for j in range(4)]
            for j in range(4):
                M[i][j] = e[j] / sum(e) + eps
        steps = [1] + [0, 1] * 2                      # it = 3: columns, then (rows, columns) x 2
        for cols in steps:
            if cols:
                s = [sum(M[i][j] for i in range(4)) + eps for j in range(4)]
                M = [[M[i][j] / s[j] for j in range(4)] for i in range(4)]
            else:
                s = [sum(M[i]) + eps for i in range(4)]
                M = [[M[i][j] / s[i] for j in range(4)] for i in range(4)]
        H = pr.sinkhorn(R, 3)
        self.assertTrue(torch.allclose(H, torch.tensor(M, dtype=torch.float64), atol=1e-15))
        H20 = pr.sinkhorn(R, 20)
        self.assertTrue(torch.allclose(H20.sum(0), torch.ones(4, dtype=torch.float64), atol=1e-5))
        self.assertTrue(torch.allclose(H20.sum(1), torch.ones(4, dtype=torch.float64), atol=1e-3))

    def test_site_at_init_is_a_plain_residual(self):
        """Spec §7.4: at init pre = 1/n (+1e-6), post = 1, H ~ I, so the equal streams read
        out the embedding and each stream gets X_i + F."""
        m = pr.PanguRef(MHC, dtype=torch.float64)
        m.init_weights(0.02, torch.Generator().manual_seed(2))
        mod = m.model.layers[0].attn_mhc_module
        x = torch.randn(3, 1, 32, dtype=torch.float64,
                        generator=torch.Generator().manual_seed(3)).expand(3, 4, 32)
        pre, post, H = mod.coefficients(x)
        # alpha·m = 0.01·(phi·x̂) with phi ~ N(0, 0.02²) over 128 inputs: |alpha·m| ≲ 0.01
        self.assertTrue(torch.allclose(pre, torch.full_like(pre, 0.25), atol=3e-3))
        self.assertTrue(torch.allclose(post, torch.ones_like(post), atol=1e-2))
        self.assertTrue(torch.allclose(H, torch.eye(4, dtype=torch.float64).expand(3, 4, 4),
                                       atol=2e-3))
        self.assertTrue(torch.allclose(mod.hc_pre(x, pre), x[:, 0], atol=1e-2))

    def test_parameter_names(self):
        shapes = {n: tuple(p.shape) for n, p in pr.PanguRef(MHC).named_parameters()}
        self.assertEqual(shapes["model.layers.1.attn_mhc_module.phi.weight"], (24, 128))
        self.assertEqual(shapes["model.layers.1.mlp_mhc_module.branch_beta"], (24,))
        self.assertEqual(shapes["model.layers.0.block_post_layernorm.weight"], (128,))
        self.assertEqual(shapes["model.layers.2.pre_mlp_layernorm.weight"], (32,))
        self.assertEqual(shapes["model.merge_mhc_module.branch_alpha_pre"], (1,))
        self.assertNotIn("model.layers.1.block_post_layernorm.weight", shapes)


class TestPadding(unittest.TestCase):
    CFG = dict(MICRO, prl_balance_loss_alpha=0.05, prl_router_z_loss_coef=0.02)

    def run_grads(self, model, batch):
        model.zero_grad(set_to_none=True)
        out = model.compute_loss(*batch, temperature=0.9)
        out.loss.backward()
        return out, {n: (p.grad.clone() if p.grad is not None else torch.zeros_like(p))
                     for n, p in model.named_parameters()}

    def test_padding_does_not_change_loss_or_gradients(self):
        model = micro_model(self.CFG, seed=7)
        tokens, lens, targets, weights = micro_batch(lens=(8, 3, 5), seed=8)
        out1, g1 = self.run_grads(model, (tokens, lens, targets, weights))
        pad = torch.arange(8)[None, :] >= lens[:, None]
        gen = torch.Generator().manual_seed(1)
        tokens2 = torch.where(pad, torch.randint(0, 64, tokens.shape, generator=gen), tokens)
        tokens2[1, 7] = 10_000                          # even out-of-range ids are ignored
        targets2 = torch.where(pad, torch.randint(0, 64, tokens.shape, generator=gen), targets)
        weights2 = torch.where(pad, torch.full_like(weights, 123.0), weights)
        out2, g2 = self.run_grads(model, (tokens2, lens, targets2, weights2))
        self.assertEqual(float(out1.loss), float(out2.loss))
        for n in g1:
            self.assertTrue(torch.equal(g1[n], g2[n]), n)
        v = ~pad
        self.assertTrue(torch.equal(out1.forward.logits[v], out2.forward.logits[v]))

    def test_loss_equals_sum_of_per_sequence_losses_without_aux(self):
        model = micro_model(MICRO, seed=7)
        tokens, lens, targets, weights = micro_batch(lens=(8, 3, 5), seed=8)
        full = model.compute_loss(tokens, lens, targets, weights, 1.0).loss
        parts = 0.0
        for b in range(3):
            L = int(lens[b])
            parts += float(model.compute_loss(tokens[b:b + 1, :L], None, targets[b:b + 1, :L],
                                              weights[b:b + 1, :L], 1.0).loss)
        self.assertAlmostEqual(float(full), parts, delta=1e-12 * max(1.0, abs(parts)))


class TestPacking(unittest.TestCase):
    """Packed rows (docs/model.md "Packed sequences"): several sequences in one row, pos
    restarting at 0 for each (-1 a padding position), give each sequence the logits, losses
    and gradients it has alone in a row; every block on (MHC plus DSA on layer 0 and an MTP
    module), both auxiliary MoE losses on."""
    CFG = dict(MHC, dsa_layers=[0], index_topk=3, index_n_heads=2, index_head_dim=8,
               num_nextn_predict_layers=1, prl_mtp_loss_weight=0.5,
               prl_balance_loss_alpha=0.05, prl_router_z_loss_coef=0.02)
    SEQS = [(0, 0, 5), (0, 5, 11), (1, 0, 4), (1, 5, 9), (2, 0, 7)]   # (row, start, end)

    def grads(self, model, *batch, pos=None):
        model.zero_grad(set_to_none=True)
        out = model.compute_loss(*batch, temperature=0.9, pos=pos)
        (out.loss + out.index).backward()
        return out, {n: (p.grad.clone() if p.grad is not None else torch.zeros_like(p))
                     for n, p in model.named_parameters()}

    def test_packed_rows_equal_one_sequence_per_row(self):
        model = micro_model(self.CFG, seed=3)
        T = 12
        g = torch.Generator().manual_seed(4)
        tokens = torch.randint(0, 64, (3, T), generator=g)
        targets = torch.randint(0, 64, (3, T), generator=g)
        weights = torch.randn(3, T, generator=g, dtype=torch.float64)
        lens = torch.tensor([11, 9, 7])
        pos = torch.full((3, T), -1, dtype=torch.long)       # row 1 position 4: padding
        n = len(self.SEQS)
        tok1 = torch.zeros(n, T, dtype=torch.long)
        tgt1 = torch.full((n, T), -1, dtype=torch.long)
        w1 = torch.zeros(n, T, dtype=torch.float64)
        for q, (r, a, e) in enumerate(self.SEQS):
            pos[r, a:e] = torch.arange(e - a)
            targets[r, e - 1] = -1                           # no target across a boundary
            tok1[q, :e - a], tgt1[q, :e - a], w1[q, :e - a] = (tokens[r, a:e], targets[r, a:e],
                                                               weights[r, a:e])
        lens1 = torch.tensor([e - a for _, a, e in self.SEQS])
        pk, gp = self.grads(model, tokens, lens, targets, weights, pos=pos)
        one, g1 = self.grads(model, tok1, lens1, tgt1, w1)
        for name in ("main", "balance", "z", "mtp", "index"):
            a, b = float(getattr(pk, name)), float(getattr(one, name))
            self.assertAlmostEqual(a, b, delta=1e-12 * max(1.0, abs(b)), msg=name)
        self.assertGreater(float(one.balance), 0)
        self.assertGreater(float(one.index), 0)
        for q, (r, a, e) in enumerate(self.SEQS):
            d = (pk.forward.logits[r, a:e] - one.forward.logits[q, :e - a]).abs().max()
            self.assertLess(float(d), 1e-12)
            sel_p = pk.forward.dsa[0]["support"][r, a:e]
            self.assertFalse(bool(sel_p[:, :a].any() or sel_p[:, e:].any()))
            self.assertTrue(torch.equal(sel_p[:, a:e], one.forward.dsa[0]["support"][q, :e - a,
                                                                                     :e - a]))
        for name in g1:
            scale = max(1.0, float(g1[name].abs().max()))
            self.assertLess(float((gp[name] - g1[name]).abs().max()) / scale, 1e-11, name)
        # the control: without pos the rows are single sequences, and the logits differ
        flat = model.compute_loss(tokens, lens, targets, weights, temperature=0.9)
        self.assertGreater(float((flat.forward.logits[0, 5:11] -
                                  one.forward.logits[1, :6]).abs().max()), 1e-3)

    def test_bad_positions_refused(self):
        model = micro_model(self.CFG, seed=3)
        tokens, lens, targets, weights = micro_batch(lens=(8, 5, 6), seed=8)
        pos = torch.arange(8).repeat(3, 1)
        pos[0, 3] = 5
        with self.assertRaisesRegex(ValueError, "pos"):
            model.forward(tokens, lens, pos=pos)


class TestRope(unittest.TestCase):
    def test_norm_preserving_and_position_zero_identity(self):
        dr, theta = 16, 10000.0
        cos, sin = pr.rope_cos_sin(300, dr, theta, torch.float64)
        x = torch.randn(300, dr, dtype=torch.float64)
        y = pr.apply_rope(x, cos, sin)
        self.assertTrue(torch.allclose(y.norm(dim=-1), x.norm(dim=-1), rtol=1e-13, atol=0))
        self.assertTrue(torch.equal(y[0], x[0]))
        self.assertFalse(torch.allclose(y[1:], x[1:]))
        # float32 too: position 0 exact, norms to rounding
        cos32, sin32 = pr.rope_cos_sin(300, dr, theta, torch.float32)
        x32 = x.float()
        y32 = pr.apply_rope(x32, cos32, sin32)
        self.assertTrue(torch.equal(y32[0], x32[0]))
        self.assertTrue(torch.allclose(y32.norm(dim=-1), x32.norm(dim=-1), rtol=1e-6))

    def test_half_split_pairs_and_frequencies(self):
        dr, theta, pos = 8, 10000.0, 5
        cos, sin = pr.rope_cos_sin(pos + 1, dr, theta, torch.float64)
        for i in range(dr // 2):
            x = torch.zeros(dr, dtype=torch.float64)
            x[i] = 1.0
            y = pr.apply_rope(x, cos[pos], sin[pos])
            ang = pos * theta ** (-2.0 * i / dr)
            expect = torch.zeros(dr, dtype=torch.float64)
            expect[i], expect[i + dr // 2] = math.cos(ang), math.sin(ang)
            self.assertTrue(torch.allclose(y, expect, atol=1e-15), (i, y, expect))

    def test_relative_position(self):
        dr = 8
        cos, sin = pr.rope_cos_sin(64, dr, 500.0, torch.float64)
        q, k = torch.randn(dr, dtype=torch.float64), torch.randn(dr, dtype=torch.float64)
        dots = [float(pr.apply_rope(q, cos[m], sin[m]) @ pr.apply_rope(k, cos[m - 7], sin[m - 7]))
                for m in (7, 20, 63)]
        self.assertAlmostEqual(dots[0], dots[1], places=12)
        self.assertAlmostEqual(dots[0], dots[2], places=12)

    def test_angles_computed_in_double_and_rounded_once(self):
        dr, theta = 16, 6.4e6
        cos, sin = pr.rope_cos_sin(512, dr, theta, torch.float32)
        for p in (0, 1, 17, 511):
            for i in range(dr // 2):
                ang = p * theta ** (-2.0 * i / dr)
                self.assertEqual(float(cos[p, i]), float(np.float32(math.cos(ang))))
                self.assertEqual(float(sin[p, i]), float(np.float32(math.sin(ang))))


class TestMoE(unittest.TestCase):
    def moe(self, cfg=None):
        model = micro_model(cfg or MICRO, seed=2)
        return model.model.layers[1].mlp

    def test_ties_go_to_the_lower_index_in_rank_order(self):
        self.assertEqual(pr.stable_topk(torch.tensor([[0.3, 0.5, 0.5, 0.1]]), 2).tolist(), [[1, 2]])
        self.assertEqual(pr.stable_topk(torch.tensor([[0.5, 0.5, 0.5, 0.5]]), 3).tolist(),
                         [[0, 1, 2]])
        self.assertEqual(pr.stable_topk(torch.tensor([[0.1, 0.2, 0.9, 0.2]]), 3).tolist(),
                         [[2, 1, 3]])
        x = torch.zeros(1000, 64)
        self.assertEqual(pr.stable_topk(x, 8).tolist(), [list(range(8))] * 1000)

    def test_router_ties_and_bias_only_selects(self):
        moe = self.moe()
        with torch.no_grad():
            moe.gate.weight.zero_()                      # s = 0.5 for every expert
            moe.e_score_correction.bias.zero_()
        x = torch.randn(5, 32, dtype=torch.float64)
        out = moe(x)
        self.assertEqual(out.sel.tolist(), [[0, 1]] * 5)
        with torch.no_grad():
            moe.e_score_correction.bias.copy_(torch.tensor([0.0, 0.1, 0.0, 0.1]))
        out2 = moe(x)
        self.assertEqual(out2.sel.tolist(), [[1, 3]] * 5)
        # gates come from s (all 0.5), not s + b: both picks weigh 1/2 each
        e1, e3 = moe.experts[1](x), moe.experts[3](x)
        expect = 0.5 * e1 + 0.5 * e3 + moe.shared_experts(x)
        self.assertTrue(torch.allclose(out2.y, expect, rtol=1e-13, atol=1e-15))

    def test_bias_update_rules(self):
        model = micro_model(MICRO, seed=2)
        l = model.moe_layers[0]
        buf = model.model.layers[l].mlp.e_score_correction.bias
        with torch.no_grad():
            buf.zero_()
        # 4 valid tokens x K=2 -> counts [3, 3, 2, 0]; cbar = 2
        routes = {l: torch.tensor([[[0, 1], [0, 1], [2, 0], [1, 2], [3, 3]]])}
        valid = torch.tensor([[True, True, True, True, False]])
        for ll in model.moe_layers[1:]:
            routes[ll] = routes[l]
        model.update_selection_bias(routes, valid, rate=0.1, rule="sign")
        self.assertTrue(torch.allclose(buf, torch.tensor([-0.1, -0.1, 0.0, 0.1],
                                                         dtype=torch.float64)))
        with torch.no_grad():
            buf.zero_()
        model.update_selection_bias(routes, valid, rate=0.1, rule="rms")
        Fq = np.array([3, 3, 2, 0]) / 8 - 0.25
        expect = -0.1 * Fq / math.sqrt((Fq ** 2).mean() + 1e-12)
        self.assertTrue(np.allclose(buf.numpy(), expect, rtol=1e-12, atol=1e-15))

    def test_override_validation(self):
        model = micro_model(MICRO, seed=2)
        tokens, lens, targets, weights = micro_batch()
        with self.assertRaises(ValueError):
            model(tokens, lens, {1: torch.full((3, 8, 2), 4)})          # expert 4 of 4
        with self.assertRaises(ValueError):
            model(tokens, lens, {1: torch.zeros(3, 8, 3, dtype=torch.long)})
        with self.assertRaises(ValueError):
            model(tokens, lens, [None])                                 # 2 MoE layers


def no_cache_generate(model, prompt, n, temperature=0.0, forced=None):
    """The oracle of cached generation: one sequence, and every step recomputes the full
    forward of prompt + tokens so far (no cache, no padding).  Greedy, or with ``forced`` the
    given tokens; returns (tokens, log-probs under log_softmax(logits / tau), tau = 1 when
    greedy)."""
    seq, toks, lps = list(prompt), [], []
    tau = temperature or 1.0
    with torch.no_grad():
        for i in range(n):
            logits = model(torch.tensor([seq])).logits[0, -1]
            tok = int(torch.argmax(logits)) if forced is None else forced[i]
            lps.append(float(F.log_softmax(logits / tau, dim=-1)[tok]))
            toks.append(tok)
            seq.append(tok)
    return toks, lps


class TestCachedGeneration(unittest.TestCase):
    """KV-cached generation (left-padded prefill, then one token per step) against a loop that
    recomputes the full forward per step, for both MLA cache forms (float64)."""

    CFG = dict(MICRO, max_position_embeddings=32)
    LENS = (5, 2, 7, 1)                  # different prompt lengths in one batch
    N = 8

    @classmethod
    def setUpClass(cls):
        cls.model = micro_model(cls.CFG, seed=3)
        g = torch.Generator().manual_seed(4)
        cls.prompts = [torch.randint(0, 64, (n,), generator=g).tolist() for n in cls.LENS]
        cls.oracle = [no_cache_generate(cls.model, p, cls.N) for p in cls.prompts]

    def mismatches(self, form):
        """Sequences whose cached greedy tokens differ from the oracle's, and the largest
        |log-prob difference| over the tokens that agree."""
        out = pr.generate(self.model, self.prompts, self.N, form)
        bad = [b for b, (toks, _) in enumerate(self.oracle) if out.tokens[b] != toks]
        diff = max(abs(a - c) for (_, lps), got in zip(self.oracle, out.logprobs)
                   for a, c in zip(lps, got))
        return bad, diff

    def test_greedy_tokens_and_logprobs_match_full_forward(self):
        distinct = {t for toks, _ in self.oracle for t in toks}
        self.assertGreater(len(distinct), 8)             # the oracle is not degenerate
        for form in pr.MLA_FORMS:
            with self.subTest(form=form):
                bad, diff = self.mismatches(form)
                self.assertEqual(bad, [], f"{form}: sequences {bad} differ")
                self.assertLess(diff, 1e-5, form)

    def test_check_catches_a_broken_cache(self):
        """Negative controls: an off-by-one RoPE position of the decoded token, and a decoded
        token that cannot see its own cache slot, must both be caught."""
        positions, bias = pr.KVCache.positions, pr.KVCache.attention_bias

        def late_position(cache, T):
            return positions(cache, T) - (1 if T == 1 else 0)

        def hide_own_slot(cache, T, dtype):
            b = bias(cache, T, dtype)
            if T == 1:
                b[..., -1] = float("-inf")
            return b

        for name, fn, patched in (("positions", late_position, "positions"),
                                  ("own slot", hide_own_slot, "attention_bias")):
            for form in pr.MLA_FORMS:
                with self.subTest(broken=name, form=form), \
                        mock.patch.object(pr.KVCache, patched, fn):
                    bad, diff = self.mismatches(form)
                    self.assertTrue(bad or diff >= 1e-5, (bad, diff))

    def test_naive_and_absorbed_forms_agree(self):
        for dtype, tol in ((torch.float64, 1e-12), (torch.float32, 1e-5)):
            model = micro_model(self.CFG, seed=3, dtype=dtype)
            caches, logits = {}, {}
            for form in pr.MLA_FORMS:
                caches[form], logits[form] = pr.prefill(model, self.prompts, 3, form)
            steps = [logits]
            for toks in ([3, 1, 4, 1], [5, 9, 2, 6], [5, 3, 5, 8]):
                t = torch.tensor(toks)[:, None]
                steps.append({f: model.forward_cached(t, caches[f]) for f in pr.MLA_FORMS})
            for i, st in enumerate(steps):
                a, b = st["naive"], st["absorbed"]
                self.assertLess(float((a - b).norm() / a.norm()), tol, (dtype, i))

    def test_cache_sizes(self):
        c = self.CFG
        H, L = c["num_attention_heads"], c["num_hidden_layers"]
        want = {"naive": L * H * (c["qk_nope_head_dim"] + c["qk_rope_head_dim"] +
                                  c["v_head_dim"]) * 8,
                "absorbed": L * (c["kv_lora_rank"] + c["qk_rope_head_dim"]) * 8}
        for form, n in want.items():
            cache, _ = pr.prefill(self.model, self.prompts, 2, form)
            self.assertEqual(cache.bytes_per_token(), n, form)
            self.assertEqual((cache.length, cache.capacity), (7, 9))
            self.assertEqual(cache.pad.tolist(), [2, 5, 0, 6])

    def test_stop_at_eos(self):
        full = self.oracle[0][0]
        eos = full[3]
        k = full.index(eos)                               # first occurrence in sequence 0
        out = pr.generate(self.model, self.prompts, self.N, "absorbed", stop_eos=True,
                          eos_id=eos)
        self.assertEqual(out.tokens[0], full[:k + 1])
        self.assertTrue(out.stopped[0])
        for b, (toks, lps) in enumerate(self.oracle):
            n = toks.index(eos) + 1 if eos in toks else self.N
            self.assertEqual(out.tokens[b], toks[:n], b)
            self.assertEqual(out.stopped[b], eos in toks, b)
            self.assertEqual(len(out.logprobs[b]), n)
        self.assertEqual(out.decode_steps,
                         max(len(t) for t in out.tokens) - (1 if all(out.stopped) else 0))

    def test_seeded_sampling_and_its_logprobs(self):
        def sample(seed):
            return pr.generate(self.model, self.prompts, self.N, "naive", temperature=0.8,
                               generator=torch.Generator().manual_seed(seed))
        a, b, c = sample(7), sample(7), sample(8)
        self.assertEqual(a.tokens, b.tokens)
        self.assertNotEqual(a.tokens, c.tokens)
        for p, toks, lps in zip(self.prompts, a.tokens, a.logprobs):
            _, want = no_cache_generate(self.model, p, self.N, 0.8, forced=toks)
            self.assertLess(max(abs(x - y) for x, y in zip(lps, want)), 1e-10)

    def test_bad_requests_raise(self):
        with self.assertRaises(ValueError):
            pr.generate(self.model, self.prompts, 26, "naive")       # 7 + 26 > 32 positions
        for prompts in ([[1, 2], []], [[1, 64]], [[1, -1]], []):
            with self.assertRaises(ValueError, msg=str(prompts)):
                pr.generate(self.model, prompts, 2, "naive")
        with self.assertRaises(ValueError):
            pr.generate(self.model, self.prompts, 2, "mqa")


class TestCachedGenerationBlocks(TestCachedGeneration):
    """Cached generation with sliding windows (W = 3 < the sequences) and parameter sinks,
    both cache forms, against the full forward per step."""

    CFG = dict(BLOCKS, max_position_embeddings=32, swa_layers=[0, 2], sliding_window_list=[3, 5])
    test_cache_sizes = None
    test_stop_at_eos = None
    test_seeded_sampling_and_its_logprobs = None
    test_bad_requests_raise = None


class TestCachedGenerationMHC(TestCachedGeneration):
    """Cached generation with mHC streams, sandwich and block post-norms on top of BLOCKS."""

    CFG = dict(MHC, max_position_embeddings=32, swa_layers=[0, 2], sliding_window_list=[3, 5])
    test_cache_sizes = None
    test_stop_at_eos = None
    test_seeded_sampling_and_its_logprobs = None
    test_bad_requests_raise = None


DSA = dict(MICRO, dsa_layers=[0], index_topk=3, index_n_heads=2, index_head_dim=8)


class TestDSA(unittest.TestCase):
    """The reference's DSA: selection semantics, detached indexer, stages."""

    def batch(self):
        g = torch.Generator().manual_seed(3)
        tokens = torch.randint(0, 64, (2, 10), generator=g)
        return tokens, torch.tensor([10, 7])

    def test_topk_at_least_t_is_dense_attention(self):
        tokens, lens = self.batch()
        dense = micro_model(MICRO, seed=2)
        sparse = pr.PanguRef(dict(DSA, index_topk=10), dtype=torch.float64)
        with torch.no_grad():       # same trunk weights and biases; a random indexer
            for n, p in sparse.named_parameters():
                p.normal_(0, 0.3)
        missing = sparse.load_state_dict(dense.state_dict(), strict=False).missing_keys
        self.assertTrue(missing and all(".indexer." in n for n in missing))
        a = dense(tokens, lens).logits
        b = sparse(tokens, lens).logits
        self.assertLess(float((a - b).abs().max()), 1e-12)
        small = pr.PanguRef(DSA, dtype=torch.float64)
        small.load_state_dict(sparse.state_dict())
        out = small(tokens, lens)
        self.assertFalse(torch.allclose(out.logits[0, 3:], a[0, 3:]))   # rows t >= 3 are sparse
        sup = out.dsa[0]["support"]
        self.assertEqual(sup[0, 9].sum().item(), 3)
        self.assertTrue(sup[0, 1, :2].all() and not sup[0, 1, 2:].any())

    def test_gradients_are_separated(self):
        tokens, lens = self.batch()
        for stage in ("sparse", "dense"):
            m = micro_model(dict(DSA, prl_dsa_stage=stage), seed=5)
            targets = torch.roll(tokens, -1, 1)
            w = torch.full(tokens.shape, -0.1, dtype=torch.float64)
            out = m.compute_loss(tokens, lens, targets, w)
            self.assertGreater(float(out.index), 0)
            ix = [p for n, p in m.named_parameters() if ".indexer." in n]
            main = [p for n, p in m.named_parameters() if ".indexer." not in n]
            g_lm = torch.autograd.grad(out.loss, ix, allow_unused=True, retain_graph=True)
            self.assertTrue(all(g is None or float(g.abs().sum()) == 0 for g in g_lm))
            g_ix = torch.autograd.grad(out.index, main, allow_unused=True, retain_graph=True)
            self.assertTrue(all(g is None or float(g.abs().sum()) == 0 for g in g_ix))
            self.assertTrue(all(g is not None for g in torch.autograd.grad(out.index, ix)))

    def test_cached_path_refuses_dsa(self):
        m = micro_model(DSA, seed=1)
        with self.assertRaises(pr.UnsupportedConfigError):
            pr.generate(m, [[1, 2, 3]], 2)


class TestConfig(unittest.TestCase):
    UNSUPPORTED = {"tie_word_embeddings": True, "scoring_func": "softmax", "model_type": "llama"}

    def test_mtp_layers_follow_the_trunk_and_train(self):
        """MTP layers are model.layers.L.. with enorm/hnorm/eh_proj, no mHC or conv; their
        loss (lambda/D sum_k) is in the total and reaches the trunk and the MTP tensors."""
        cfg = dict(MICRO, num_nextn_predict_layers=2, prl_mtp_loss_weight=0.5, use_mhc=True,
                   mhc_num_stream=2, router_sliding_window=3, prl_mtp_head=True)
        m = pr.PanguRef(cfg, dtype=torch.float64)
        m.init_weights(std=0.2, generator=torch.Generator().manual_seed(3))
        names = dict(m.named_parameters())
        for n in ["model.layers.3.enorm.weight", "model.layers.3.hnorm.weight",
                  "model.layers.4.eh_proj.weight", "model.layers.4.shared_head.norm.weight",
                  "model.layers.4.shared_head.head.weight"]:
            self.assertIn(n, names)
        self.assertEqual(tuple(names["model.layers.3.eh_proj.weight"].shape), (32, 64))
        self.assertNotIn("model.layers.3.attn_mhc_module.phi.weight", names)
        self.assertNotIn("model.layers.3.self_attn.qa_conv.weight", names)
        g = torch.Generator().manual_seed(4)
        tokens = torch.randint(0, 64, (2, 8), generator=g)
        targets = torch.roll(tokens, -1, 1)
        weights = torch.full((2, 8), -1 / 16, dtype=torch.float64)
        out = m.compute_loss(tokens, torch.tensor([8, 5]), targets, weights)
        self.assertGreater(float(out.mtp), 0)
        self.assertAlmostEqual(float(out.loss), float(out.main + out.balance + out.z + out.mtp))
        out.mtp.backward()
        for n in ["model.layers.4.eh_proj.weight", "model.layers.0.self_attn.q_a_proj.weight",
                  "model.embed_tokens.weight", "model.layers.3.shared_head.head.weight"]:
            self.assertGreater(float(names[n].grad.abs().sum()), 0, n)
        self.assertIsNone(names["lm_head.weight"].grad)  # the MTP layers have their own heads

    def test_interleaved_rope_dot_products_match_pairwise_rotation(self):
        """transformers' de-interleave + rotate_half gives the q.k of rotating each pair
        (x[2i], x[2i+1]) in place by pos * inv_freq_i (docs/model.md "RoPE")."""
        g = torch.Generator().manual_seed(3)
        T, d = 7, 8
        q, k = torch.randn(T, d, generator=g, dtype=torch.float64), torch.randn(
            T, d, generator=g, dtype=torch.float64)
        rs = {"type": "yarn", "factor": 4.0, "original_max_position_embeddings": 16,
              "mscale": 1.0, "mscale_all_dim": 0.5}
        cos, sin = pr.rope_cos_sin_scaled(T, d, 10000.0, rs, torch.float64)

        def pairwise(x):
            y = x.clone()
            for t in range(T):
                for i in range(d // 2):
                    a, b = x[t, 2 * i], x[t, 2 * i + 1]
                    y[t, 2 * i] = a * cos[t, i] - b * sin[t, i]
                    y[t, 2 * i + 1] = b * cos[t, i] + a * sin[t, i]
            return y

        got = pr.apply_rope_interleave(q, cos, sin) @ pr.apply_rope_interleave(k, cos, sin).T
        torch.testing.assert_close(got, pairwise(q) @ pairwise(k).T, rtol=1e-12, atol=1e-12)
        # the attention factor of YaRN (mscale / mscale_all_dim) is on cos and sin
        af = pr.yarn_attention_factor(rs)
        self.assertAlmostEqual(af, (0.1 * math.log(4) + 1) / (0.05 * math.log(4) + 1), places=12)
        torch.testing.assert_close(cos[0], torch.full((d // 2,), af, dtype=torch.float64))

    def test_unsupported_blocks_raise_naming_the_key(self):
        for key, val in self.UNSUPPORTED.items():
            cfg = dict(MICRO, **{key: val})
            with self.assertRaises(pr.UnsupportedConfigError, msg=key) as cm:
                pr.PanguRef(cfg)
            self.assertIn(key, str(cm.exception))
        # DeepSeek's selection rule other than noaux_tc (openPangu's code does not read it)
        with self.assertRaises(pr.UnsupportedConfigError) as cm:
            pr.PanguRef(dict(MICRO, model_type="deepseek_v3", topk_method="greedy"))
        self.assertIn("topk_method", str(cm.exception))
        pr.PanguRef(dict(MICRO, topk_method="greedy"))

    def test_switched_off_blocks_and_foreign_keys_are_accepted(self):
        cfg = dict(MICRO, dsa_layers=[], swa_layers=[], param_sink_number=0, use_mome=False,
                   router_sliding_window=0, use_mhc=False, sandwich_norm=False,
                   num_nextn_predict_layers=0, architectures=["OpenPanguV2ForCausalLM"],
                   model_type="openpangu_v2", torch_dtype="float32", bos_token_id=1,
                   eos_token_id=2, prl_bias_update_rate=0.001, prl_something_else=True)
        m = pr.PanguRef(cfg)
        self.assertIn("architectures", m.cfg.ignored_keys)

    def test_parameter_names_and_shapes(self):
        m = pr.PanguRef(MICRO)
        shapes = {n: tuple(p.shape) for n, p in m.named_parameters()}
        self.assertEqual(shapes["model.embed_tokens.weight"], (64, 32))
        self.assertEqual(shapes["lm_head.weight"], (64, 32))
        self.assertEqual(shapes["model.layers.0.self_attn.q_b_proj.weight"], (2 * 12, 16))
        self.assertEqual(shapes["model.layers.0.self_attn.kv_a_proj_with_mqa.weight"], (20, 32))
        self.assertEqual(shapes["model.layers.0.self_attn.kv_b_proj.weight"], (2 * 16, 16))
        self.assertEqual(shapes["model.layers.0.self_attn.o_proj.weight"], (32, 16))
        self.assertEqual(shapes["model.layers.0.mlp.gate_proj.weight"], (64, 32))
        self.assertEqual(shapes["model.layers.1.mlp.gate.weight"], (4, 32))
        self.assertEqual(shapes["model.layers.2.mlp.experts.3.down_proj.weight"], (32, 16))
        self.assertEqual(shapes["model.layers.2.mlp.shared_experts.up_proj.weight"], (16, 32))
        self.assertNotIn("model.layers.1.mlp.e_score_correction.bias", shapes)
        self.assertIn("model.layers.1.mlp.e_score_correction.bias", m.state_dict())
        self.assertEqual(m.model.layers[0].self_attn.q_a_layernorm.eps, 1e-6)
        self.assertEqual(m.model.layers[0].self_attn.kv_a_layernorm.eps, 1e-6)
        self.assertEqual(m.model.layers[0].input_layernorm.eps, 1e-5)
        self.assertEqual(len(shapes), 3 + 3 * 9 + 3 + 2 * (1 + 4 * 3 + 3))


class TestSafetensors(unittest.TestCase):
    def test_round_trip_all_dtypes(self):
        rng = np.random.default_rng(0)
        bf = np.array([1.0, -2.5, 3.140625, 0.0, -0.0, np.inf, 65280.0], dtype=np.float32)
        t = {"f32": rng.standard_normal((3, 4)).astype(np.float32),
             "f64": rng.standard_normal((2, 2, 2)),
             "f16": rng.standard_normal(5).astype(np.float16),
             "i32": rng.integers(-2**31, 2**31 - 1, (4,), dtype=np.int32),
             "i64": rng.integers(-2**62, 2**62, (2, 3), dtype=np.int64),
             "u8": np.arange(7, dtype=np.uint8), "i8": np.array([-128, 127], dtype=np.int8),
             "flag": np.array([True, False]), "scalar": np.float64(3.5),
             "empty": np.zeros((0, 3), dtype=np.float32), "bf": bf,
             "tbf": torch.tensor([1.5, -7.0, 0.1]).bfloat16()}
        md = {"temperature": "1.0", "b": "x"}
        with tempfile.TemporaryDirectory() as d:
            path = os.path.join(d, "a.safetensors")
            pr.write_safetensors(path, t, md, dtypes={"bf": "BF16"})
            back, md2, dts = pr.read_safetensors(path, with_dtypes=True)
        self.assertEqual(md2, md)
        self.assertEqual(dts["bf"], "BF16")
        self.assertEqual(dts["tbf"], "BF16")
        self.assertEqual(dts["f16"], "F16")
        self.assertEqual(dts["flag"], "BOOL")
        self.assertEqual(set(back), set(t))
        for k, v in t.items():
            if k == "tbf":
                v = v.float().numpy()
            v = np.asarray(v)
            self.assertEqual(back[k].shape, v.shape, k)
            self.assertTrue(np.array_equal(back[k], v), k)
            if k not in ("bf", "tbf"):
                self.assertEqual(back[k].dtype, v.dtype, k)

    def test_bf16_rounding(self):
        x = np.array([1.0 + 2 ** -8, 1.0 + 3 * 2 ** -8, 1.0 + 2 ** -9], dtype=np.float32)
        back = pr.bf16_bits_to_f32(pr.f32_to_bf16_bits(x))
        self.assertEqual(back.tolist(), [1.0, 1.0 + 2 ** -6, 1.0])   # ties to even
        self.assertTrue(np.isnan(pr.bf16_bits_to_f32(pr.f32_to_bf16_bits(np.float32("nan")))))

    def test_reference_layout_bytes(self):
        data = np.arange(6, dtype=np.float32).reshape(1, 2, 3)
        out = pr.serialize_safetensors({"attn.0": data})
        hdr = b'{"attn.0":{"dtype":"F32","shape":[1,2,3],"data_offsets":[0,24]}}'
        self.assertEqual(out, (64).to_bytes(8, "little") + hdr + data.tobytes())
        out = pr.serialize_safetensors({"attn0": data.reshape(1, 1, 2, 3)})
        self.assertEqual(int.from_bytes(out[:8], "little"), 72)
        self.assertTrue(out[8:80].endswith(b"}}" + b" " * 7))
        self.assertEqual(pr.serialize_safetensors({}), (8).to_bytes(8, "little") + b"{}" + b" " * 6)
        self.assertEqual(pr.serialize_safetensors({}, {"framework": "pt"}),
                         (40).to_bytes(8, "little") + b'{"__metadata__":{"framework":"pt"}}' +
                         b" " * 5)

    def test_writer_order_and_alignment(self):
        t = {"b": np.zeros(3, np.float32), "a": np.zeros(1, np.float32),
             "z": np.zeros(2, np.int64), "c": np.zeros(5, np.uint8), "d": np.zeros(1, np.float16)}
        out = pr.serialize_safetensors(t, {"k": "v"})
        n = int.from_bytes(out[:8], "little")
        self.assertEqual(n % 8, 0)
        hdr = json.loads(out[8:8 + n])
        names = [k for k in hdr if k != "__metadata__"]
        self.assertEqual(list(hdr)[0], "__metadata__")
        self.assertEqual(names, ["z", "a", "b", "d", "c"])     # I64, F32 (by name), F16, U8
        offs = [hdr[k]["data_offsets"] for k in names]
        self.assertEqual(offs, [[0, 16], [16, 20], [20, 32], [32, 34], [34, 39]])

    def test_reader_rejects_malformed_files(self):
        good = pr.serialize_safetensors({"a": np.zeros(2, np.float32),
                                         "b": np.zeros(3, np.float32)})
        n = int.from_bytes(good[:8], "little")
        hdr = json.loads(good[8:8 + n])

        def with_header(h, data_len=20, n_override=None):
            hb = json.dumps(h).encode()
            hb += b" " * ((8 - len(hb) % 8) % 8)
            nn = len(hb) if n_override is None else n_override
            return nn.to_bytes(8, "little") + hb + b"\0" * data_len

        cases = {
            "too small": b"\x01\x02",
            "header past end": (10 ** 6).to_bytes(8, "little") + b"{}",
            "header too large": (2 * 10 ** 8).to_bytes(8, "little") + b"{}",
            "not json": (8).to_bytes(8, "little") + b"{nope}  ",
            "gap": with_header({"a": dict(hdr["a"], data_offsets=[0, 8]),
                                "b": dict(hdr["b"], data_offsets=[12, 24])}, 24),
            "overlap": with_header({"a": dict(hdr["a"], data_offsets=[0, 8]),
                                    "b": dict(hdr["b"], data_offsets=[4, 16])}, 16),
            "size mismatch": with_header({"a": dict(hdr["a"], data_offsets=[0, 12]),
                                          "b": dict(hdr["b"], data_offsets=[12, 24])}, 24),
            "trailing bytes": with_header(hdr, 24),
            "truncated data": with_header(hdr, 16),
            "bad dtype": with_header({"a": dict(hdr["a"], dtype="Q8"),
                                      "b": hdr["b"]}, 20),
            "negative shape": with_header({"a": dict(hdr["a"], shape=[-2]),
                                           "b": hdr["b"]}, 20),
            "bad metadata": with_header(dict(hdr, __metadata__={"x": 1}), 20),
            "duplicate name": (lambda hb: len(hb).to_bytes(8, "little") + hb + b"\0" * 8)(
                b'{"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]},'
                b'"a":{"dtype":"F32","shape":[1],"data_offsets":[4,8]}}  '),
        }
        pr.deserialize_safetensors(with_header(hdr, 20))           # the control parses
        for what, buf in cases.items():
            with self.assertRaises(pr.SafetensorsError, msg=what):
                pr.deserialize_safetensors(buf)

    def test_checkpoint_round_trip_and_bias_alias(self):
        model = micro_model(MICRO, seed=4, dtype=torch.float32)
        with tempfile.TemporaryDirectory() as d:
            pr.save_checkpoint(model, d)
            back = pr.load_checkpoint(d, torch.float32)
            for (n, a), (_, b) in zip(model.state_dict().items(), back.state_dict().items()):
                self.assertTrue(torch.equal(a, b), n)
            # alias name for the bias, and a missing bias means zero
            t, md = pr.read_safetensors(os.path.join(d, "model.safetensors"))
            t["model.layers.1.mlp.gate.e_score_correction_bias"] = t.pop(
                "model.layers.1.mlp.e_score_correction.bias")
            del t["model.layers.2.mlp.e_score_correction.bias"]
            pr.write_safetensors(os.path.join(d, "model.safetensors"), t, md)
            back = pr.load_checkpoint(d, torch.float64)
            self.assertTrue(torch.equal(back.model.layers[1].mlp.e_score_correction.bias,
                                        model.model.layers[1].mlp.e_score_correction.bias.double()))
            self.assertEqual(float(back.model.layers[2].mlp.e_score_correction.bias.abs().sum()), 0)
            t["model.layers.0.bogus.weight"] = np.zeros(1, np.float32)
            pr.write_safetensors(os.path.join(d, "model.safetensors"), t, md)
            with self.assertRaises(ValueError):
                pr.load_checkpoint(d)


def run_cli(*args, env=None):
    return subprocess.run([PY, REF_PY, *args], capture_output=True, text=True, env=env)


class TestCLI(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.tmp = tempfile.TemporaryDirectory()
        d = cls.tmp.name
        cls.cfg = os.path.join(d, "config.json")
        with open(cls.cfg, "w") as fh:
            json.dump(dict(MICRO, initializer_range=0.2, prl_balance_loss_alpha=0.01,
                           prl_router_z_loss_coef=0.001, architectures=["x"]), fh)
        cls.ckpt, cls.batch, cls.out = (os.path.join(d, x) for x in ("ck", "b.st", "f.st"))
        for args in (("init", "--config", cls.cfg, "--out", cls.ckpt, "--seed", "1",
                      "--random-norms"),
                     ("make-batch", "--config", cls.cfg, "--out", cls.batch, "--batch", "3",
                      "--seq", "12", "--seed", "2", "--temperature", "0.8"),
                     ("forward", "--ckpt", cls.ckpt, "--batch", cls.batch, "--out", cls.out,
                      "--out-dtype", "float64")):
            r = run_cli(*args)
            assert r.returncode == 0, r.stderr

    @classmethod
    def tearDownClass(cls):
        cls.tmp.cleanup()

    def compare(self, tensors, *extra):
        path = os.path.join(self.tmp.name, "prl.st")
        pr.write_safetensors(path, tensors)
        return run_cli("compare", "--ckpt", self.ckpt, "--batch", self.batch, "--prl", path,
                       *extra)

    def outputs(self):
        return pr.read_safetensors(self.out)[0]

    def test_compare_passes_on_reference_output(self):
        r = self.compare(self.outputs())
        self.assertEqual(r.returncode, 0, r.stdout + r.stderr)
        self.assertIn("PASS", r.stdout)
        r = self.compare(self.outputs(), "--json")
        rep = json.loads(r.stdout)
        self.assertTrue(rep["pass"])
        self.assertLess(rep["logits"]["rel_err"], 1e-12)

    def test_compare_ignores_padding_rows(self):
        t = self.outputs()
        lens = pr.read_safetensors(self.batch)[0]["lens"]
        self.assertLess(int(lens.min()), 12)
        for b, L in enumerate(lens):
            t["logits"][b, L:] = 1e6
        t["logits"] = t["logits"].astype(np.float32)
        r = self.compare(t)
        self.assertEqual(r.returncode, 0, r.stdout)

    def test_compare_fails_on_wrong_gradient_and_names_it(self):
        t = self.outputs()
        name = "grad.model.layers.2.self_attn.kv_b_proj.weight"
        t[name] = t[name] * (1 + 2e-4)
        r = self.compare(t)
        self.assertEqual(r.returncode, 1)
        self.assertIn("FAIL", r.stdout)
        self.assertIn(name, r.stdout.split("FAIL:")[1])

    def test_compare_fails_on_wrong_logits(self):
        t = self.outputs()
        t["logits"] = t["logits"] * (1 + 2e-5)
        r = self.compare(t)
        self.assertEqual(r.returncode, 1)
        self.assertIn("logits", r.stdout.split("FAIL:")[1])

    def test_compare_fails_on_missing_and_extra_gradients(self):
        t = self.outputs()
        del t["grad.lm_head.weight"]
        t["grad.model.layers.1.mlp.e_score_correction.bias"] = np.zeros(4, np.float32)
        r = self.compare(t, "--json")
        self.assertEqual(r.returncode, 1)
        rep = json.loads(r.stdout)
        self.assertEqual(rep["missing_grads"], ["lm_head.weight"])
        self.assertEqual(rep["extra_grads"], ["model.layers.1.mlp.e_score_correction.bias"])

    def test_compare_fails_on_non_tie_route_difference(self):
        t = self.outputs()
        r0 = t["routes.1"].copy()
        t["routes.1"][0, 0] = [x for x in range(4) if x not in r0[0, 0]][:2]
        r = self.compare(t)
        self.assertEqual(r.returncode, 1)
        self.assertIn("routes.1[0,0]", r.stdout)

    def test_bench_smoke(self):
        r = run_cli("bench", "--config", self.cfg, "--batch", "2", "--seq", "8", "--threads",
                    "1", "--steps", "2", "--warmup", "1", "--seed", "0", "--json")
        self.assertEqual(r.returncode, 0, r.stderr)
        rep = json.loads(r.stdout)
        for k in ("tokens_per_s", "step_s_median", "step_s_all", "threads", "torch", "blas",
                  "parallel_info"):
            self.assertIn(k, rep)
        self.assertEqual(len(rep["step_s_all"]), 2)
        self.assertEqual(rep["threads"], 1)

    def write_prompts(self, prompts):
        path = os.path.join(self.tmp.name, "prompts.json")
        with open(path, "w") as fh:
            json.dump(prompts, fh)
        return path

    def test_generate_matches_no_cache_oracle(self):
        prompts = [[5, 17, 3], [40], [9, 9, 2, 61, 7]]
        path = self.write_prompts(prompts)
        model = pr.load_checkpoint(self.ckpt, torch.float64)
        want = [no_cache_generate(model, p, 5) for p in prompts]
        for form in pr.MLA_FORMS:
            r = run_cli("generate", "--ckpt", self.ckpt, "--prompts", path, "--new-tokens", "5",
                        "--mla", form, "--json")
            self.assertEqual(r.returncode, 0, r.stderr)
            seqs = json.loads(r.stdout)["sequences"]
            self.assertEqual([s["tokens"] for s in seqs], [w[0] for w in want], form)
            for s, (_, lps) in zip(seqs, want):
                self.assertLess(max(abs(a - b) for a, b in zip(s["logprobs"], lps)), 1e-5)
                self.assertEqual(s["stopped_at_eos"], False)
                self.assertEqual(len(s["margins"]), 5)
                self.assertTrue(all(m >= 0 for m in s["margins"]))

    def test_bench_decode_smoke(self):
        keys = ("batch", "prompt_len", "new_tokens", "threads", "mla", "prefill_seconds_median",
                "decode_seconds_median", "decode_tokens_per_s_median", "rounds",
                "kv_cache_bytes_per_token", "torch_version", "torch_threads")
        for form, bytes_per_token in (("naive", 3 * 2 * 20 * 4), ("absorbed", 3 * 20 * 4)):
            r = run_cli("bench-decode", "--config", self.cfg, "--batch", "2", "--prompt-len",
                        "4", "--new-tokens", "3", "--threads", "1", "--rounds", "3", "--warmup",
                        "1", "--mla", form, "--json")
            self.assertEqual(r.returncode, 0, r.stderr)
            self.assertIn("threads", r.stderr)           # thread / BLAS record on stderr
            rep = json.loads(r.stdout)
            for k in keys:
                self.assertIn(k, rep)
            self.assertEqual((rep["batch"], rep["prompt_len"], rep["new_tokens"], rep["mla"],
                              rep["threads"], rep["torch_threads"]), (2, 4, 3, form, 1, 1))
            self.assertEqual(len(rep["rounds"]), 3)
            self.assertEqual(rep["kv_cache_bytes_per_token"], bytes_per_token)
            self.assertAlmostEqual(rep["decode_tokens_per_s_median"],
                                   6 / rep["decode_seconds_median"])
            self.assertEqual(sorted(x["decode_seconds"] for x in rep["rounds"])[1],
                             rep["decode_seconds_median"])

    def test_bench_decode_with_prompt_file(self):
        path = self.write_prompts([[20, 21, 22], [30] * 6])
        r = run_cli("bench-decode", "--ckpt", self.ckpt, "--prompts", path, "--new-tokens", "2",
                    "--rounds", "1", "--warmup", "0", "--json")
        self.assertEqual(r.returncode, 0, r.stderr)
        rep = json.loads(r.stdout)
        self.assertEqual((rep["batch"], rep["prompt_len"], rep["prompt_lens"]), (2, 6, [3, 6]))
        r = run_cli("bench-decode", "--ckpt", self.ckpt, "--prompts", path, "--batch", "3",
                    "--new-tokens", "2", "--rounds", "1")
        self.assertEqual(r.returncode, 2)
        bad = self.write_prompts([[1, 2], [64]])           # id out of the vocab
        r = run_cli("generate", "--ckpt", self.ckpt, "--prompts", bad, "--new-tokens", "2")
        self.assertEqual(r.returncode, 2)
        self.assertIn("prompt 1", r.stderr)

    def test_unsupported_config_fails_cleanly(self):
        bad = os.path.join(self.tmp.name, "bad.json")
        with open(bad, "w") as fh:
            json.dump(dict(MICRO, layer_types=["sliding_attention"]), fh)
        r = run_cli("init", "--config", bad, "--out", os.path.join(self.tmp.name, "x"))
        self.assertNotEqual(r.returncode, 0)
        self.assertIn("layer_types", r.stderr)


if __name__ == "__main__":
    torch.set_num_threads(1)
    unittest.main()
