#!/usr/bin/env python3
"""GPT-2 training speed in PyTorch on one GPU: the side-by-side reference for perf/bench_gpu.sh
(perf/RESULTS.md, "GPU: GPT-2 124M on one H200"; issue 13, "Benchmarks").

The model is pdtrain's (llm.c's) GPT-2: learned position embedding, pre-LayerNorm blocks
(LayerNorm eps 1e-5, attention with a fused qkv projection and biases, MLP 4C with GELU tanh),
final LayerNorm, LM head tied to the token embedding, vocabulary 50257 padded to 50304 rows as
llm.c does (the loss runs over the padded logits, as nanoGPT does; token ids stay below 50257).
Training as in pdtrain's GPU decks (perf/decks/gpt2_*_gpu.toml): bf16 autocast with fp32
master weights, F.scaled_dot_product_attention(is_causal=True), torch.optim.AdamW(fused=True)
(betas 0.9/0.95, weight decay 0.1 on matrices), global gradient-norm clipping at 1.0,
micro-batch 16 x 1024 tokens accumulated 32 times per optimizer step (524,288 tokens), random
token ids generated on the device (no data loading), TF32 left off (every matmul is bf16).

Each run builds a fresh model, runs --warmup optimizer steps (torch.compile compiles in them),
then times --steps steps with CUDA events (time.perf_counter on the CPU). Prints one line per
run:

  pytorch model=124m mode=eager params=124475904 micro_batch=16x1024 accum=32
    tokens_per_step=524288 steps=3 step_ms=... tokens_per_s=... mfu_989=... peak_alloc_mib=...
    peak_reserved_mib=... device_used_mib=... pgo_mib=... warmup_s=... loss=...

MFU: tokens/s x (6 N + 6 L T C) / 989e12 (N every parameter, the tied embedding once, at the
padded vocabulary; llm.c's gpt2_estimate_mfu convention, the same as perf/bench_gpu.sh).
peak_alloc_mib is torch.cuda.max_memory_allocated over the run (parameters, gradients, AdamW
state, activations; not the CUDA context or the caching allocator's slack: peak_reserved_mib
adds the slack); device_used_mib is the whole GPU's used memory after the timed steps
(cudaMemGetInfo: context and cached blocks included, comparable to bench_gpu.sh's nvidia-smi
peak); pgo_mib = parameters + gradients + AdamW m and v in fp32 = 16 N bytes.

Usage:
  python3 perf/pytorch_gpt2.py [--runs 124m:eager,350m:eager,124m:compile] [--steps 3]
                               [--warmup N] [--accum 32] [--budget S] [--results FILE]
  python3 perf/pytorch_gpt2.py --device cpu --tiny      # the script's own check, on a CPU

--runs: model:mode pairs, model 124m | 350m | tiny, mode eager | compile.
--budget S: start no run after S seconds (default 0: no limit).
--results FILE: also append the `pytorch ...` lines to FILE (perf/bench_gpu.sh --compare).
--tiny: 2 layers, d 64, 4 heads, vocab 512, seq 64, micro-batch 4, accumulation 2, 2 steps.
Exit status: 0 ok, 1 a failure (a line with FAIL), 77 (SKIP) without torch or, for
--device cuda, without a CUDA device.
"""

import argparse
import math
import os
import sys
import time

PEAK_FLOPS = 989e12  # H200 dense bf16

MODELS = {  # name: (n_layer, n_head, d_model, vocab, padded vocab, seq_len)
    "124m": (12, 12, 768, 50257, 50304, 1024),
    "350m": (24, 16, 1024, 50257, 50304, 1024),
    "tiny": (2, 4, 64, 512, 512, 64),
}


def skip(why):
    print(f"pytorch_gpt2: SKIP: {why}", flush=True)
    sys.exit(77)


def build_model_classes(torch):
    nn = torch.nn
    F = torch.nn.functional

    class Block(nn.Module):
        def __init__(self, C, H):
            super().__init__()
            self.H = H
            self.ln_1 = nn.LayerNorm(C, eps=1e-5)
            self.c_attn = nn.Linear(C, 3 * C)
            self.attn_proj = nn.Linear(C, C)
            self.ln_2 = nn.LayerNorm(C, eps=1e-5)
            self.c_fc = nn.Linear(C, 4 * C)
            self.mlp_proj = nn.Linear(4 * C, C)

        def forward(self, x):
            B, T, C = x.shape
            q, k, v = self.c_attn(self.ln_1(x)).split(C, dim=2)
            q = q.view(B, T, self.H, C // self.H).transpose(1, 2)
            k = k.view(B, T, self.H, C // self.H).transpose(1, 2)
            v = v.view(B, T, self.H, C // self.H).transpose(1, 2)
            y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
            x = x + self.attn_proj(y.transpose(1, 2).contiguous().view(B, T, C))
            x = x + self.mlp_proj(F.gelu(self.c_fc(self.ln_2(x)), approximate="tanh"))
            return x

    class GPT2(nn.Module):
        def __init__(self, L, H, C, Vp, T):
            super().__init__()
            self.wte = nn.Embedding(Vp, C)
            self.wpe = nn.Embedding(T, C)
            self.blocks = nn.ModuleList([Block(C, H) for _ in range(L)])
            self.ln_f = nn.LayerNorm(C, eps=1e-5)
            self.lm_head = nn.Linear(C, Vp, bias=False)
            self.lm_head.weight = self.wte.weight  # tied
            std = 0.02
            for name, p in self.named_parameters():
                if p.dim() == 2:
                    s = std / math.sqrt(2 * L) if name.endswith("proj.weight") else std
                    nn.init.normal_(p, 0.0, s)
                elif name.endswith("bias"):
                    nn.init.zeros_(p)

        def forward(self, idx, targets):
            B, T = idx.shape
            pos = torch.arange(T, device=idx.device)
            x = self.wte(idx) + self.wpe(pos)
            for b in self.blocks:
                x = b(x)
            logits = self.lm_head(self.ln_f(x))
            return F.cross_entropy(logits.view(-1, logits.size(-1)), targets.view(-1))

    return GPT2


def expected_params(L, C, Vp, T):
    return 12 * L * C * C + 13 * L * C + Vp * C + T * C + 2 * C


def run_one(torch, GPT2, args, model_name, mode, device, log):
    L, H, C, V, Vp, T = MODELS[model_name]
    B, accum = args.micro_batch, args.accum
    if args.tiny:
        B, accum = 4, 2
    cuda = device.type == "cuda"
    torch.manual_seed(1337)
    if cuda:
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats()
    model = GPT2(L, H, C, Vp, T).to(device)
    n = sum(p.numel() for p in model.parameters())
    if n != expected_params(L, C, Vp, T):
        print(f"pytorch model={model_name} mode={mode}: FAIL: {n} parameters, expected "
              f"{expected_params(L, C, Vp, T)}", flush=True)
        return False
    decay = [p for p in model.parameters() if p.dim() >= 2]
    no_decay = [p for p in model.parameters() if p.dim() < 2]
    groups = [{"params": decay, "weight_decay": 0.1}, {"params": no_decay, "weight_decay": 0.0}]
    try:
        opt = torch.optim.AdamW(groups, lr=6e-4, betas=(0.9, 0.95), eps=1e-8, fused=True)
        fused = "fused"
    except (RuntimeError, TypeError) as e:  # a CPU build without the fused CPU kernel
        if cuda:
            raise
        opt = torch.optim.AdamW(groups, lr=6e-4, betas=(0.9, 0.95), eps=1e-8)
        fused = f"unfused ({e})"
    step_model = torch.compile(model) if mode == "compile" else model
    gen = torch.Generator(device=device)
    gen.manual_seed(42)
    xs = torch.randint(0, V, (accum, B, T), device=device, generator=gen)
    ys = torch.randint(0, V, (accum, B, T), device=device, generator=gen)
    amp = torch.autocast(device_type=device.type, dtype=torch.bfloat16)

    def step():
        total = 0.0
        for i in range(accum):
            with amp:
                loss = step_model(xs[i], ys[i]) / accum
            loss.backward()
            total = total + loss.detach()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)
        return total

    warmup = args.warmup if args.warmup is not None else (2 if mode == "compile" else 1)
    t0 = time.perf_counter()
    for _ in range(warmup):
        loss = step()
    if cuda:
        torch.cuda.synchronize()
    warmup_s = time.perf_counter() - t0
    times = []
    for _ in range(args.steps):
        if cuda:
            e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            e0.record()
            loss = step()
            e1.record()
            e1.synchronize()
            times.append(e0.elapsed_time(e1))
        else:
            s0 = time.perf_counter()
            loss = step()
            times.append(1e3 * (time.perf_counter() - s0))
    loss_v = float(loss)
    step_ms = sum(times) / len(times)
    tokens = B * T * accum
    tps = tokens / (step_ms / 1e3)
    mfu = tps * (6 * n + 6 * L * T * C) / PEAK_FLOPS
    if cuda:
        peak_alloc = torch.cuda.max_memory_allocated() / 2**20
        peak_res = torch.cuda.max_memory_reserved() / 2**20
        free, total = torch.cuda.mem_get_info()
        mem = (f"peak_alloc_mib={peak_alloc:.0f} peak_reserved_mib={peak_res:.0f} "
               f"device_used_mib={(total - free) / 2**20:.0f}")
    else:
        mem = "peak_alloc_mib=n/a peak_reserved_mib=n/a device_used_mib=n/a"
    line = (f"pytorch model={model_name} mode={mode} params={n} micro_batch={B}x{T} "
            f"accum={accum} tokens_per_step={tokens} steps={len(times)} step_ms={step_ms:.1f} "
            f"tokens_per_s={tps:.0f} mfu_989={mfu:.4f} {mem} pgo_mib={16 * n / 2**20:.1f} "
            f"warmup_s={warmup_s:.1f} loss={loss_v:.4f}")
    log(line)
    print(f"  (step times ms: {' '.join(f'{t:.1f}' for t in times)}; AdamW {fused})", flush=True)
    ok = math.isfinite(loss_v) and abs(loss_v - math.log(V)) < 1.5
    if not ok:
        print(f"pytorch model={model_name} mode={mode}: FAIL: loss {loss_v} is not near "
              f"ln(vocab) = {math.log(V):.3f} after {warmup + len(times)} steps", flush=True)
    del step_model, model, opt, xs, ys
    if mode == "compile":
        torch._dynamo.reset()  # frees the compiled graphs before the next run
    return ok


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--device", default="cuda", choices=["cuda", "cpu"])
    ap.add_argument("--tiny", action="store_true")
    ap.add_argument("--runs", default=None)
    ap.add_argument("--steps", type=int, default=None)
    ap.add_argument("--warmup", type=int, default=None)
    ap.add_argument("--accum", type=int, default=32)
    ap.add_argument("--micro-batch", type=int, default=16)
    ap.add_argument("--budget", type=float, default=0)
    ap.add_argument("--results", default=None)
    args = ap.parse_args()
    if args.runs is None:
        args.runs = "tiny:eager" if args.tiny else "124m:eager,350m:eager,124m:compile"
    if args.steps is None:
        args.steps = 2 if args.tiny else 3
    runs = []
    for r in args.runs.split(","):
        m, _, mode = r.partition(":")
        if m not in MODELS or mode not in ("eager", "compile"):
            ap.error(f"--runs: '{r}' is not MODEL:MODE (models {', '.join(MODELS)}; modes eager, compile)")
        if args.tiny and m != "tiny":
            ap.error("--tiny runs only the tiny model")
        runs.append((m, mode))
    if args.steps < 1 or args.accum < 1 or args.micro_batch < 1:
        ap.error("--steps, --accum and --micro-batch must be positive")

    t_start = time.perf_counter()
    try:
        import torch
    except Exception as e:  # noqa: BLE001 - any import failure means: no usable torch
        skip(f"python3 cannot import torch ({type(e).__name__}: {e})")
    if args.device == "cuda" and not torch.cuda.is_available():
        skip(f"torch {torch.__version__} sees no CUDA device")
    device = torch.device(args.device)
    if args.device == "cuda":
        torch.cuda.set_device(0)
        p = torch.cuda.get_device_properties(0)
        where = f"{p.name} (sm_{p.major}{p.minor}, {p.total_memory / 2**30:.0f} GiB), CUDA {torch.version.cuda}"
    else:
        where = f"CPU ({os.cpu_count()} cores, {torch.get_num_threads()} threads)"
    print(f"pytorch_gpt2: torch {torch.__version__} on {where}; bf16 autocast, SDPA is_causal, "
          f"fused AdamW, tied embedding, GELU tanh, LayerNorm eps 1e-5, vocab padded like llm.c; "
          f"FLOPs/token = 6 N + 6 L T C (llm.c); peak {PEAK_FLOPS:.3g} FLOP/s", flush=True)

    results = open(args.results, "a") if args.results else None

    def log(line):
        print(line, flush=True)
        if results:
            results.write(line + "\n")
            results.flush()

    GPT2 = build_model_classes(torch)
    failures = 0
    for m, mode in runs:
        elapsed = time.perf_counter() - t_start
        if args.budget > 0 and elapsed > args.budget:
            print(f"pytorch model={m} mode={mode}: skipped (time budget: {elapsed:.0f}s > {args.budget:.0f}s)",
                  flush=True)
            continue
        try:
            if not run_one(torch, GPT2, args, m, mode, device, log):
                failures += 1
        except Exception as e:  # noqa: BLE001 - report and go on with the next run
            print(f"pytorch model={m} mode={mode}: FAIL: {type(e).__name__}: {str(e)[:2000]}", flush=True)
            failures += 1
        if device.type == "cuda":
            torch.cuda.empty_cache()
    if results:
        results.close()
    total = time.perf_counter() - t_start
    if failures:
        print(f"pytorch_gpt2: FAIL: {failures} run(s) failed ({total:.0f}s)", flush=True)
        return 1
    print(f"pytorch_gpt2: ok ({total:.0f}s)", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
