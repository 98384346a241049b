"""Kernel-level measurements of PyTorch's own CUDA kernels on a lent GPU (issue 15's evidence for the Megatron
stacks' unmeasured numbers): the host's issue time per eager kernel, the HBM rate of the memory-bound kernels
Megatron-Core leaves to PyTorch (casts, elementwise, softmax, top-k, gather/scatter), BF16 GEMMs writing BF16,
writing FP32 and accumulating into FP32 (TE's wgrad into main_grad), and per-expert GEMM loops on one and four
streams. Prints one CSV row per measurement: section,name,shape,us,rate,unit,note. Usage: python3 this.py"""
import sys
import time

import torch
import torch.nn.functional as F

dev = torch.device("cuda")
props = torch.cuda.get_device_properties(dev)
print(f"# {props.name}, {props.multi_processor_count} SMs, torch {torch.__version__}, cuda {torch.version.cuda}")
print("section,name,shape,us,rate,unit,note")
out = sys.stdout


def row(*cols):
    print(",".join(str(c) for c in cols), flush=True)


def gpu_time(fn, iters=20, warm=3):
    for _ in range(warm):
        fn()
    torch.cuda.synchronize()
    a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    a.record()
    for _ in range(iters):
        fn()
    b.record()
    torch.cuda.synchronize()
    return a.elapsed_time(b) * 1e3 / iters  # us per call


# 1. Host issue time per eager kernel: many tiny kernels back to back; the GPU finishes each in ~2 us, so the
#    loop's wall time per op is the host's (Python + dispatcher + cudaLaunchKernel).
x = torch.ones(1024, device=dev, dtype=torch.bfloat16)
y = torch.ones(1024, device=dev, dtype=torch.bfloat16)
for name, fn in [("add_", lambda: x.add_(1.0)), ("mul", lambda: x * y), ("silu", lambda: F.silu(x)),
                 ("mm_64", lambda: torch.mm(x.view(32, 32), y.view(32, 32)))]:
    for _ in range(200):
        fn()
    torch.cuda.synchronize()
    n = 5000
    t0 = time.perf_counter()
    for _ in range(n):
        fn()
    torch.cuda.synchronize()
    row("host", name, "1024", f"{(time.perf_counter() - t0) * 1e6 / n:.2f}", "", "", "wall us per eager call")

# 2. Memory-bound kernels: bytes read + written per call over event time.
for numel in [1 << 20, 1 << 22, 1 << 24, 1 << 26, 1 << 28]:
    a = torch.randn(numel, device=dev, dtype=torch.bfloat16)
    b = torch.randn(numel, device=dev, dtype=torch.bfloat16)
    c = torch.empty_like(a)
    h = a.view(-1, 4096)
    g = torch.randn(h.shape[0], 2 * 4096, device=dev, dtype=torch.bfloat16) if numel <= 1 << 26 else None
    w = torch.ones(4096, device=dev, dtype=torch.bfloat16)
    cases = [
        ("copy", lambda: c.copy_(a), 4 * numel),
        ("add", lambda: torch.add(a, b, out=c), 6 * numel),
        ("to_fp32", lambda: a.float(), 6 * numel),
        ("rms_norm", lambda: F.rms_norm(h, (4096,), w), 4 * numel),
        ("softmax_fp32", lambda: torch.softmax(h, -1, dtype=torch.float32), 6 * numel),
    ]
    if g is not None:
        cases.append(("swiglu_eager", lambda: F.silu(g[:, :4096]) * g[:, 4096:], 6 * numel + 4 * numel))
    for name, fn, nbytes in cases:
        us = gpu_time(fn)
        row("hbm", name, numel, f"{us:.2f}", f"{nbytes / us / 1e3:.1f}", "GB/s", "bytes read+written")
    del a, b, c, h, g
    torch.cuda.empty_cache()

# Router and permute kernels at MoE shapes: tokens x experts logits, top-k, gather rows, scatter-add rows.
for tokens, experts, k, hidden in [(4096, 128, 8, 4096), (8192, 256, 8, 7168), (16384, 64, 6, 2048)]:
    logits = torch.randn(tokens, experts, device=dev, dtype=torch.float32)
    us = gpu_time(lambda: torch.topk(torch.softmax(logits, -1), k, -1))
    row("router", "softmax_topk", f"{tokens}x{experts}k{k}", f"{us:.2f}", "", "", "two kernels+")
    hs = torch.randn(tokens, hidden, device=dev, dtype=torch.bfloat16)
    idx = torch.randint(0, tokens, (tokens * k,), device=dev)
    us = gpu_time(lambda: hs.index_select(0, idx))
    nbytes = 2 * 2 * tokens * k * hidden
    row("permute", "index_select", f"{tokens * k}x{hidden}", f"{us:.2f}", f"{nbytes / us / 1e3:.1f}", "GB/s", "")
    rows = torch.randn(tokens * k, hidden, device=dev, dtype=torch.bfloat16)
    dst = torch.zeros(tokens, hidden, device=dev, dtype=torch.bfloat16)
    ix = idx.view(-1, 1).expand(-1, hidden)
    us = gpu_time(lambda: dst.scatter_add_(0, ix, rows))
    row("permute", "scatter_add", f"{tokens * k}x{hidden}", f"{us:.2f}", f"{nbytes / us / 1e3:.1f}", "GB/s", "")
    del logits, hs, idx, rows, dst, ix
torch.cuda.empty_cache()

# 3. Weight-gradient GEMMs as Megatron + TE run them: dW [m, n] = X^T dY with X [k tokens, m] and dY [k, n]
#    (X transposed in place, as the backward holds it), writing BF16, writing FP32, and accumulating into an
#    FP32 buffer (D = A.B + C: TE's fuse_wgrad_accumulation into main_grad). Each variant is timed three times,
#    interleaved, and the median kept; the accumulate variant's kernel names are printed once per shape.
def median3(fns):
    times = {name: [] for name in fns}
    for _ in range(3):
        for name, fn in fns.items():
            times[name].append(gpu_time(fn, iters=20))
    return {name: sorted(t)[1] for name, t in times.items()}


def kernel_names(fn):
    from torch.profiler import ProfilerActivity, profile
    fn()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        fn()
        torch.cuda.synchronize()
    return ";".join(e.key[:90] for e in prof.key_averages() if e.device_type.name == "CUDA")


for m, n, k in [(8192, 8192, 8192), (7168, 2048, 8192), (2048, 7168, 8192), (7168, 4096, 8192),
                (4096, 7168, 4096), (4096, 1536, 4096), (1536, 4096, 4096), (4096, 3072, 4096),
                (3072, 4096, 4096), (4096, 14336, 4096), (14336, 4096, 4096), (7168, 18432, 4096),
                (18432, 7168, 4096), (4096, 4096, 16384), (2048, 2816, 16384), (1408, 2048, 16384)]:
    X = torch.randn(k, m, device=dev, dtype=torch.bfloat16)
    dY = torch.randn(k, n, device=dev, dtype=torch.bfloat16)
    A = X.t()
    C = torch.zeros(m, n, device=dev, dtype=torch.float32)
    flop = 2 * m * n * k
    fns = {"bf16_out": lambda: torch.mm(A, dY)}
    try:
        torch.mm(A, dY, out_dtype=torch.float32)
        fns["fp32_out"] = lambda: torch.mm(A, dY, out_dtype=torch.float32)
    except Exception as e:  # noqa: BLE001
        row("wgrad", "fp32_out", f"{m}x{n}x{k}", "", "", "", f"unsupported: {type(e).__name__}")
    try:
        torch.addmm(C, A, dY, out_dtype=torch.float32, out=C)
        fns["fp32_accum"] = lambda: torch.addmm(C, A, dY, out_dtype=torch.float32, out=C)
    except Exception as e:  # noqa: BLE001
        row("wgrad", "fp32_accum", f"{m}x{n}x{k}", "", "", "", f"unsupported: {type(e).__name__}: {str(e)[:80]}")
    for name, us in median3(fns).items():
        row("wgrad", name, f"{m}x{n}x{k}", f"{us:.2f}", f"{flop / us / 1e6:.1f}", "TFLOPS", "median of 3 x 20")
    for name, fn in fns.items():
        row("kernels", name, f"{m}x{n}x{k}", "", "", "", kernel_names(fn).replace(",", " "))
    if m == 8192 and n == 8192:
        try:
            A8 = torch.randn(m, k, device=dev).to(torch.float8_e4m3fn)
            B8 = torch.randn(n, k, device=dev).to(torch.float8_e4m3fn).t()
            one = torch.ones((), device=dev)
            B16 = torch.randn(k, n, device=dev, dtype=torch.bfloat16)
            A16 = torch.randn(m, k, device=dev, dtype=torch.bfloat16)
            t = median3({"fp8": lambda: torch._scaled_mm(A8, B8, one, one, out_dtype=torch.bfloat16),
                         "bf16": lambda: torch.mm(A16, B16)})
            for name, us in t.items():
                row("gemm", name + "_8192cube", f"{m}x{n}x{k}", f"{us:.2f}", f"{flop / us / 1e6:.1f}", "TFLOPS", "")
        except Exception as e:  # noqa: BLE001
            row("gemm", "fp8_scaled_mm", f"{m}x{n}x{k}", "", "", "", f"failed: {type(e).__name__}")
    del X, dY, A, C
torch.cuda.empty_cache()

# 4. Per-expert GEMM loops (TE GroupedLinear's shape of work: one cuBLAS GEMM per expert, round-robin over
#    four streams) against the same launches on one stream, each captured in a CUDA graph and replayed, so no
#    host time is in the loop: what is left is the GPU's concurrency of per-expert GEMMs. Y_e = X_e W_e with
#    X_e [rows, k] and W_e [k, n].
#    The GPU slows under sustained GEMMs (on 2026-12-04 a BF16 8192^3 GEMM fell from 787 to 678 TFLOP/s within
#    a minute), and a training step is sustained: so the section first runs GEMMs for kWarmS seconds, then
#    times a reference 8192^3 GEMM before every shape (a row "grouped_ref" per shape), so each shape's rates
#    can be read against the clocks it ran at.
kWarmS = 30
ref_a = torch.randn(8192, 8192, device=dev, dtype=torch.bfloat16)
ref_b = torch.randn(8192, 8192, device=dev, dtype=torch.bfloat16)


def reference(tag):
    us = gpu_time(lambda: torch.mm(ref_a, ref_b), iters=10, warm=1)
    row("grouped_ref", tag, "8192x8192x8192", f"{us:.2f}", f"{2 * 8192**3 / us / 1e6:.1f}", "TFLOPS", "")


reference("cold")
t_warm = time.perf_counter()
while time.perf_counter() - t_warm < kWarmS:
    for _ in range(20):
        torch.mm(ref_a, ref_b)
    torch.cuda.synchronize()
reference(f"after {kWarmS} s of GEMMs")
streams = [torch.cuda.Stream() for _ in range(4)]
for experts, rows_, n, k in [
        (16, 256, 3072, 4096), (16, 512, 3072, 4096), (16, 1024, 3072, 4096), (16, 2048, 3072, 4096),
        (16, 256, 4096, 1536), (16, 512, 4096, 1536), (16, 1024, 4096, 1536), (16, 2048, 4096, 1536),
        (8, 512, 4096, 7168), (8, 1024, 4096, 7168), (8, 2048, 4096, 7168), (8, 4096, 4096, 7168),
        (8, 512, 7168, 2048), (8, 1024, 7168, 2048), (8, 2048, 7168, 2048), (8, 4096, 7168, 2048),
        (32, 256, 1536, 2048), (32, 512, 1536, 2048), (32, 1024, 1536, 2048), (32, 2048, 1536, 2048),
        (32, 256, 2048, 768), (32, 512, 2048, 768), (32, 1024, 2048, 768), (32, 2048, 2048, 768),
        (8, 1024, 28672, 4096), (8, 2048, 28672, 4096), (8, 1024, 4096, 14336), (8, 2048, 4096, 14336)]:
    As = [torch.randn(rows_, k, device=dev, dtype=torch.bfloat16) for _ in range(experts)]
    Bs = [torch.randn(k, n, device=dev, dtype=torch.bfloat16) for _ in range(experts)]
    Ys = [torch.empty(rows_, n, device=dev, dtype=torch.bfloat16) for _ in range(experts)]
    flop = 2 * experts * rows_ * n * k

    def on_streams(count):
        def fn():
            cur = torch.cuda.current_stream()
            for s_ in streams[:count]:
                s_.wait_stream(cur)
            for i, (a_, b_, y_) in enumerate(zip(As, Bs, Ys)):
                with torch.cuda.stream(streams[i % count]):
                    torch.mm(a_, b_, out=y_)
            for s_ in streams[:count]:
                cur.wait_stream(s_)
        return fn

    shape = f"{experts}x{rows_}x{n}x{k}"
    reference(f"before {shape}")
    graphs = {}
    for name, count in [("1stream_graph", 1), ("4streams_graph", 4)]:
        fn = on_streams(count)
        fn()
        torch.cuda.synchronize()
        try:
            graphs[name] = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graphs[name]):
                fn()
        except Exception as e:  # noqa: BLE001
            row("grouped", name, shape, "", "", "", f"failed: {type(e).__name__}")
            graphs.pop(name)
    for name, us in median3({nm: g.replay for nm, g in graphs.items()}).items():
        row("grouped", name, shape, f"{us:.2f}", f"{flop / us / 1e6:.1f}", "TFLOPS", "CUDA graph replay, median of 3 x 20")
    A1, B1, Y1 = As[0], Bs[0], Ys[0]
    us = gpu_time(lambda: torch.mm(A1, B1, out=Y1), iters=50)
    row("grouped", "one_expert_eager", f"1x{rows_}x{n}x{k}", f"{us:.2f}", f"{2 * rows_ * n * k / us / 1e6:.1f}",
        "TFLOPS", "eager: host-bound where short")
    del As, Bs, Ys, graphs
    torch.cuda.empty_cache()
reference("after")
del ref_a, ref_b
print("# done", flush=True)
