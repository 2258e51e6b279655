#!/usr/bin/env python3
"""PyTorch's causal scaled dot-product attention on one GPU at the shape of
perf/bench_attention_kernels.cpp (GPT-2 124M: B 16, T 1024, NH 12, HS 64, bf16), each of its
backends that runs there (flash, cuDNN, memory-efficient), forward and backward timed with CUDA
events, best of --repeats, in bench_attention_kernels' line format and FLOP count (the causal
lower triangle: 2 products forward, 4 backward, 2 HS flops per score pair) so the lines sit
side by side with pdtrain's kernels and cuDNN through pdtrain's graph:

  attention pytorch_cudnn forward B=16 T=1024 NH=12 HS=64 ms=... tflops=... bound_ms=... fraction=...

A backend PyTorch cannot run there prints "attention pytorch_<name> unavailable: <why>". Exit
status 0 (a line "bench_attention_pytorch: ok"), 77 without torch or a GPU.
"""
import argparse
import sys


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--batch", type=int, default=16)
    p.add_argument("--seq", type=int, default=1024)
    p.add_argument("--heads", type=int, default=12)
    p.add_argument("--head-size", type=int, default=64)
    p.add_argument("--iters", type=int, default=10)
    p.add_argument("--warmup", type=int, default=2)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--peak-tflops", type=float, default=989.0)
    a = p.parse_args()
    try:
        import torch
        import torch.nn.functional as F
        from torch.nn.attention import SDPBackend, sdpa_kernel
    except Exception as e:  # no torch, or one without torch.nn.attention
        print(f"bench_attention_pytorch: no usable torch: {e}")
        return 77
    if not torch.cuda.is_available():
        print("bench_attention_pytorch: no GPU visible")
        return 77
    B, T, NH, HS = a.batch, a.seq, a.heads, a.head_size
    pairs = B * NH * T * (T + 1) / 2

    def report(name, pass_, ms, products):
        flops = products * 2.0 * HS * pairs
        bound_ms = flops / (a.peak_tflops * 1e12) * 1e3
        print(f"attention {name:<12} {pass_:<8} B={B} T={T} NH={NH} HS={HS} ms={ms:.4f} "
              f"tflops={flops / (ms * 1e-3) / 1e12:.2f} bound_ms={bound_ms:.4f} "
              f"fraction={bound_ms / ms:.4f}", flush=True)

    def best_ms(f):
        start, stop = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        for _ in range(a.warmup):
            f()
        best = float("inf")
        for _ in range(a.repeats):
            start.record()
            for _ in range(a.iters):
                f()
            stop.record()
            stop.synchronize()
            best = min(best, start.elapsed_time(stop) / a.iters)
        return best

    g = torch.Generator(device="cuda").manual_seed(1)
    q, k, v = (torch.randn(B, NH, T, HS, device="cuda", dtype=torch.bfloat16, generator=g,
                           requires_grad=True) for _ in range(3))
    dout = torch.randn(B, NH, T, HS, device="cuda", dtype=torch.bfloat16, generator=g)
    backends = [("pytorch_flash", SDPBackend.FLASH_ATTENTION),
                ("pytorch_cudnn", getattr(SDPBackend, "CUDNN_ATTENTION", None)),
                ("pytorch_mem_eff", SDPBackend.EFFICIENT_ATTENTION)]
    for name, backend in backends:
        if backend is None:
            print(f"attention {name} unavailable: this torch has no such backend")
            continue
        try:
            with sdpa_kernel(backend):
                out = F.scaled_dot_product_attention(q, k, v, is_causal=True)
                report(name, "forward",
                       best_ms(lambda: F.scaled_dot_product_attention(q, k, v, is_causal=True)), 2)
                # The backward alone: one graph kept (retain_graph) and its gradient taken again.
                report(name, "backward",
                       best_ms(lambda: torch.autograd.grad(out, (q, k, v), dout, retain_graph=True)),
                       4)
        except RuntimeError as e:
            print(f"attention {name} unavailable: {str(e).splitlines()[0]}")
    print(f"bench_attention_pytorch: ok (torch {torch.__version__})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
