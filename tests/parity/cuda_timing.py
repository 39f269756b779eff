"""CUDA-event timing and peak-memory helpers shared by the parity harnesses (GPU host, torch)."""


def event_times_ms(fn, warmup, iters):
    """Per-call times of `fn` in ms: CUDA events around each of `iters` calls after `warmup`."""
    import torch

    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    ts = []
    for _ in range(iters):
        s = torch.cuda.Event(enable_timing=True)
        e = torch.cuda.Event(enable_timing=True)
        s.record()
        fn()
        e.record()
        e.synchronize()
        ts.append(s.elapsed_time(e))
    return ts


def peak_extra_bytes(fn, empty_cache=False):
    """Device memory one call of `fn` allocates at its peak beyond what was allocated before."""
    import torch

    torch.cuda.synchronize()
    if empty_cache:
        torch.cuda.empty_cache()
    torch.cuda.reset_peak_memory_stats()
    base = torch.cuda.memory_allocated()
    r = fn()
    torch.cuda.synchronize()
    peak = torch.cuda.max_memory_allocated() - base
    del r
    return int(peak)
