#!/usr/bin/env python3
"""Times one decoder layer of a Llama-style model config in PyTorch eager, as a baseline for ppbench.

CUDA mode (the default, --device cuda; used by scripts/gpu_check.sh): one layer in bf16 in the
shapes of ppb_gpu_bench (prefill B=1 x T=--prompt tokens; decode --batch sequences at a KV cache
of --context positions), timed with CUDA events (median of --iters after 3 warm-ups), and prints
the ratio to ppbench's CUDA stage read from ppb_gpu_bench --out FILE:

    python3 scripts/torch_layer.py --model inputs/models/llama-3.1-8b.json --bench FILE

CPU mode (--device cpu; used by the C++ benchmark that compares ppbench's CPU kernels to PyTorch
eager): float32, torch.set_num_threads(--threads) (and the BLAS library's thread count), one
interop thread, torch.manual_seed(0). It builds one decoder layer of the config plus the head
(final RMSNorm + lm_head Linear(hidden, vocab_size) + argmax, the greedy next token) and times
three operations under torch.inference_mode(), each with time.perf_counter around one forward,
median of --iters forwards after 3 warm-ups:

    layer_prefill  the layer on x [batch, prompt, hidden] from position 0 (causal, writes the KV cache)
    layer_decode   the layer on x [batch, 1, hidden] at position --context (attends context+1 positions)
    head_decode    norm + lm_head + argmax on [batch, 1, hidden]

With --flush-mb N (MiB, default 0 = warm) a float32 buffer of N MiB is touched with an in-place
add before each timed forward, outside the timed interval, so that the weights are evicted from
the last-level cache as on ppbench's side. It prints one line

    layer_prefill_ms=<float> layer_decode_ms=<float> head_decode_ms=<float>

and exits. With --serve it builds the modules, prints `ready`, then reads commands from stdin, one
a line: `time` times the three operations (each the median of --iters forwards) and prints that one
line; `quit` or end of input exits 0. This lets the caller interleave its repetitions with torch's
in one long-lived process:

    /usr/bin/python3 scripts/torch_layer.py --device cpu --model inputs/models/qwen3-0.6b.json \\
        --batch 4 --prompt 128 --context 128 --threads 1 --serve

Layer architecture from the config: hidden_size, num_attention_heads, num_key_value_heads,
head_dim (default hidden/heads), intermediate_size, rms_norm_eps, rope_theta; model_type "qwen3":
RMSNorm over head_dim on q and k before RoPE (HF Qwen3Attention's q_norm/k_norm); model_type
"qwen2" or attention_bias true: bias on the q/k/v projections. Attention is HF's: SDPA with
enable_gqa where this torch has it, else K/V repeated per query head (repeat_kv) and SDPA, or
where torch has no SDPA (< 2.0) HF's eager attention (matmul, mask, softmax, matmul); the faster
variant is reported. A bad config field: a message on stderr and exit status 2.
"""
import argparse
import json
import math
import os
import sys
import time


def fail(msg):
    print(f"torch_layer.py: {msg}", file=sys.stderr)
    sys.exit(2)


def read_config(path, need_vocab):
    """The layer's (and head's) shape from an HF config.json; exits 2 on a missing or bad field."""
    try:
        with open(path) as f:
            cfg = json.load(f)
    except (OSError, ValueError) as e:
        fail(f"cannot read model config {path}: {e}")
    if not isinstance(cfg, dict):
        fail(f"{path}: not a JSON object")

    def pos_int(name, default=None):
        v = cfg.get(name)
        if v is None:
            if default is None:
                fail(f"{path}: missing field {name}")
            return default
        if isinstance(v, bool) or not isinstance(v, int) or v <= 0:
            fail(f"{path}: {name} must be a positive integer, not {v!r}")
        return v

    def pos_num(name, default):
        v = cfg.get(name)
        if v is None:
            return default
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not v > 0 or not math.isfinite(v):
            fail(f"{path}: {name} must be a positive number, not {v!r}")
        return float(v)

    c = {}
    c["H"] = pos_int("hidden_size")
    c["nh"] = pos_int("num_attention_heads")
    c["nkv"] = pos_int("num_key_value_heads", c["nh"])
    if c["nh"] % c["nkv"]:
        fail(f"{path}: num_attention_heads {c['nh']} is not a multiple of num_key_value_heads {c['nkv']}")
    if cfg.get("head_dim") is None and c["H"] % c["nh"]:
        fail(f"{path}: no head_dim, and hidden_size {c['H']} is not a multiple of num_attention_heads {c['nh']}")
    c["hd"] = pos_int("head_dim", c["H"] // c["nh"])
    if c["hd"] % 2:
        fail(f"{path}: head_dim {c['hd']} must be even for RoPE")
    c["inter"] = pos_int("intermediate_size")
    c["eps"] = pos_num("rms_norm_eps", 1e-5)
    c["theta"] = pos_num("rope_theta", 10000.0)
    c["vocab"] = pos_int("vocab_size") if need_vocab else cfg.get("vocab_size")
    mt = cfg.get("model_type", "llama")
    if not isinstance(mt, str):
        fail(f"{path}: model_type must be a string, not {mt!r}")
    ab = cfg.get("attention_bias", False)
    if ab is None:
        ab = False
    if not isinstance(ab, bool):
        fail(f"{path}: attention_bias must be true or false, not {ab!r}")
    c["qk_norm"] = mt == "qwen3"
    c["qkv_bias"] = mt == "qwen2" or ab
    return c


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--device", choices=("cuda", "cpu"), default="cuda")
    ap.add_argument("--model", default="inputs/models/llama-3.1-8b.json")
    ap.add_argument("--bench", default="", help="CUDA mode: ppb_gpu_bench --out FILE to compare with")
    ap.add_argument("--prompt", type=int, default=2048)
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--context", type=int, default=2048)
    ap.add_argument("--iters", type=int, default=20)
    ap.add_argument("--threads", type=int, default=1, help="CPU mode: torch (and BLAS) threads")
    ap.add_argument("--flush-mb", type=int, default=0,
                    help="CPU mode: MiB of float32 buffer touched before each timed forward (0 = warm)")
    ap.add_argument("--serve", action="store_true", help="CPU mode: print ready, then answer `time`/`quit` on stdin")
    a = ap.parse_args()
    cpu = a.device == "cpu"
    for name in ("prompt", "batch", "iters", "threads"):
        if getattr(a, name) < 1:
            ap.error(f"--{name} must be at least 1")
    if a.context < 0 or a.flush_mb < 0:
        ap.error("--context and --flush-mb must not be negative")
    if a.serve and not cpu:
        ap.error("--serve needs --device cpu")
    c = read_config(a.model, need_vocab=cpu)
    if cpu:
        # Before torch loads its BLAS: torch.set_num_threads sets OpenMP's (and MKL's) count, but
        # not that of an OpenBLAS or BLIS built with pthreads, as Debian's torch uses.
        for var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "BLIS_NUM_THREADS", "MKL_NUM_THREADS"):
            os.environ[var] = str(a.threads)
    import torch
    import torch.nn.functional as F

    H, nh, nkv, hd = c["H"], c["nh"], c["nkv"], c["hd"]
    inter, eps = c["inter"], c["eps"]
    if cpu:
        torch.set_num_threads(a.threads)
        try:
            torch.set_num_interop_threads(1)
        except RuntimeError:  # already set (only possible once, before any parallel work)
            pass
        dev, dt = "cpu", torch.float32
    else:
        dev, dt = "cuda", torch.bfloat16
    torch.manual_seed(0)

    def lin(o, i, bias=False):
        return torch.nn.Linear(i, o, bias=bias, device=dev, dtype=dt)

    qb = c["qkv_bias"]
    q, k, v, o = lin(nh * hd, H, qb), lin(nkv * hd, H, qb), lin(nkv * hd, H, qb), lin(H, nh * hd)
    gate, up, down = lin(inter, H), lin(inter, H), lin(H, inter)
    w1 = torch.ones(H, device=dev, dtype=dt)
    w2 = torch.ones(H, device=dev, dtype=dt)
    wq = torch.ones(hd, device=dev, dtype=dt)  # Qwen3 q_norm / k_norm
    wk = torch.ones(hd, device=dev, dtype=dt)
    max_ctx = max(a.prompt, a.context + 1)
    inv = 1.0 / (c["theta"] ** (torch.arange(0, hd, 2, device=dev, dtype=torch.float32) / hd))
    ang = torch.outer(torch.arange(max_ctx, device=dev, dtype=torch.float32), inv)
    cos = torch.cat([ang.cos(), ang.cos()], -1).to(dt)
    sin = torch.cat([ang.sin(), ang.sin()], -1).to(dt)
    have_sdpa = hasattr(F, "scaled_dot_product_attention")
    if not have_sdpa:  # HF eager attention's causal mask, made once per model forward there
        causal = torch.ones(max_ctx, max_ctx, device=dev, dtype=torch.bool).triu(1)

    def rms(x, w):  # LlamaRMSNorm
        xf = x.float()
        return (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)).to(dt) * w

    def rot(x):
        x1, x2 = x.chunk(2, -1)
        return torch.cat([-x2, x1], -1)

    def attend(qs, kk, vv, pos, T):
        if have_sdpa:
            return F.scaled_dot_product_attention(qs, kk, vv, is_causal=T > 1)
        # HF's eager_attention_forward (torch < 2.0 has no SDPA)
        w = torch.matmul(qs, kk.transpose(2, 3)) * (1.0 / math.sqrt(hd))
        if T > 1:
            w.masked_fill_(causal[pos:pos + T, :pos + T], float("-inf"))
        w = F.softmax(w, dim=-1, dtype=torch.float32).to(dt)
        return torch.matmul(w, vv)

    def layer(x, pos, kc, vc):
        B, T, _ = x.shape
        h = rms(x, w1)
        qs = q(h).view(B, T, nh, hd)
        ks = k(h).view(B, T, nkv, hd)
        if c["qk_norm"]:  # Qwen3Attention: RMSNorm over head_dim before RoPE
            qs, ks = rms(qs, wq), rms(ks, wk)
        qs, ks = qs.transpose(1, 2), ks.transpose(1, 2)
        vs = v(h).view(B, T, nkv, hd).transpose(1, 2)
        c_, s = cos[pos:pos + T], sin[pos:pos + T]
        qs, ks = qs * c_ + rot(qs) * s, ks * c_ + rot(ks) * s
        kc[:, :, pos:pos + T] = ks
        vc[:, :, pos:pos + T] = vs
        kk, vv = kc[:, :, :pos + T], vc[:, :, :pos + T]
        if gqa[0]:  # torch >= 2.5: the KV heads are read in place
            att = F.scaled_dot_product_attention(qs, kk, vv, is_causal=T > 1, enable_gqa=True)
        else:  # HF's repeat_kv: copies K and V per query head
            kk = kk.repeat_interleave(nh // nkv, 1)
            vv = vv.repeat_interleave(nh // nkv, 1)
            att = attend(qs, kk, vv, pos, T)
        x = x + o(att.transpose(1, 2).reshape(B, T, nh * hd))
        h = rms(x, w2)
        return x + down(F.silu(gate(h)) * up(h))

    # The baseline is the faster of SDPA with enable_gqa (where this torch has it) and HF's
    # repeat_kv + SDPA, so that "not slower than PyTorch eager" is not judged against a copy
    # PyTorch need not make.
    variants = [False]
    try:
        z = torch.zeros(1, 2, 1, 8, device=dev, dtype=dt)
        F.scaled_dot_product_attention(z, z[:, :1], z[:, :1], enable_gqa=True)
        variants.append(True)
    except (TypeError, RuntimeError, AttributeError):
        pass
    gqa = [False]

    if cpu:
        cpu_mode(a, torch, F, c, layer, rms, lin, variants, gqa, max_ctx, dev, dt)
        return

    def timed(fn):
        for _ in range(3):
            fn()
        torch.cuda.synchronize()
        ts = []
        for _ in range(a.iters):
            s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            s.record()
            fn()
            e.record()
            e.synchronize()
            ts.append(s.elapsed_time(e))
        return sorted(ts)[len(ts) // 2]

    prefill = decode = math.inf
    with torch.inference_mode():
        for gqa[0] in variants:
            kc = torch.zeros(1, nkv, max_ctx, hd, device=dev, dtype=dt)
            vc = torch.zeros_like(kc)
            xp = torch.randn(1, a.prompt, H, device=dev, dtype=dt)
            prefill = min(prefill, timed(lambda: layer(xp, 0, kc, vc)))
            kc = torch.zeros(a.batch, nkv, max_ctx, hd, device=dev, dtype=dt)
            vc = torch.zeros_like(kc)
            xd = torch.randn(a.batch, 1, H, device=dev, dtype=dt)
            decode = min(decode, timed(lambda: layer(xd, a.context, kc, vc)))
    ours = {}
    if a.bench and os.path.exists(a.bench):  # absent when ppb_gpu_bench failed: torch's times still print
        for line in open(a.bench):
            if "=" in line:
                key, val = line.strip().split("=", 1)
                ours[key] = float(val)
    print(f"torch {torch.__version__} eager, bf16, one layer (SDPA enable_gqa tried: {len(variants) > 1}):")
    for name, t, key in (("prefill B=1 T=%d" % a.prompt, prefill, "layer_prefill_ms"),
                         ("decode B=%d ctx=%d" % (a.batch, a.context), decode, "layer_decode_ms")):
        mine = ours.get(key, math.nan)
        # Issue 3: not slower than PyTorch eager, i.e. torch/ppbench >= 1.
        verdict = "n/a (no ppb_gpu_bench number)" if math.isnan(mine) else ("PASS" if t >= mine else "FAIL")
        print(f"  {name:24s} torch {t:8.3f} ms   ppbench {mine:8.3f} ms   torch/ppbench {t / mine:5.2f}x  {verdict}")


def cpu_mode(a, torch, F, c, layer, rms, lin, variants, gqa, max_ctx, dev, dt):
    """Float32 on the CPU: prefill and decode of --batch sequences, and the head; see the docstring."""
    H, nkv, hd = c["H"], c["nkv"], c["hd"]
    lm_head = lin(c["vocab"], H)
    wf = torch.ones(H, device=dev, dtype=dt)

    def head(x):  # final RMSNorm + lm_head + greedy next token
        return torch.argmax(lm_head(rms(x, wf)), dim=-1)

    # Prefill writes positions [0, prompt) of its cache; decode attends a cache already holding
    # --context positions (random, as written by an earlier prefill) plus its own.
    kp = torch.zeros(a.batch, nkv, max_ctx, hd, device=dev, dtype=dt)
    vp = torch.zeros_like(kp)
    kd = torch.randn(a.batch, nkv, max_ctx, hd, device=dev, dtype=dt)
    vd = torch.randn(a.batch, nkv, max_ctx, hd, device=dev, dtype=dt)
    xp = torch.randn(a.batch, a.prompt, H, device=dev, dtype=dt)
    xd = torch.randn(a.batch, 1, H, device=dev, dtype=dt)
    # Real pages (not the shared zero page), touched before each timed forward: evicts the weights
    # from the last-level cache, as ppbench's CpuDevice::flush_caches does.
    flush = torch.ones((a.flush_mb << 20) // 4, device=dev, dtype=torch.float32) if a.flush_mb else None

    def timed(fn):
        for _ in range(3):
            fn()
        ts = []
        for _ in range(a.iters):
            if flush is not None:
                flush.add_(1.0)
            t0 = time.perf_counter()
            fn()
            ts.append((time.perf_counter() - t0) * 1e3)
        return sorted(ts)[len(ts) // 2]

    def measure():
        prefill = decode = math.inf
        with torch.inference_mode():
            for gqa[0] in variants:
                prefill = min(prefill, timed(lambda: layer(xp, 0, kp, vp)))
                decode = min(decode, timed(lambda: layer(xd, a.context, kd, vd)))
            hd_ms = timed(lambda: head(xd))
        print(f"layer_prefill_ms={prefill:.6f} layer_decode_ms={decode:.6f} head_decode_ms={hd_ms:.6f}", flush=True)

    if not a.serve:
        measure()
        return
    print("ready", flush=True)
    while True:
        line = sys.stdin.readline()
        if not line:  # EOF
            return
        cmd = line.strip()
        if cmd == "time":
            measure()
        elif cmd == "quit":
            return
        elif cmd:
            fail(f"unknown command {cmd!r} (expected time or quit)")


if __name__ == "__main__":
    main()
