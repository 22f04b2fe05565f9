import time, numpy as np
from hetflow.devices.cpu import spin_pool, threads
from hetflow.devices.cpu.spin_pool import Job, JobScript, argument_block

def _noop(args, chunk, chunks):
    args[1 + chunk] += 1

addr = spin_pool.job(_noop)
for chunks in (2, 4):
    blocks = [np.zeros(16, np.int64) for _ in range(56)]
    script = JobScript([Job(addr, b, chunks, ()) for b in blocks])
    with threads.own_threads(2, spin=True):
        pool = threads.spinning()
        ts = []
        for i in range(2000):
            t = time.perf_counter(); pool.replay(script); ts.append(time.perf_counter() - t)
    print(f"56 empty jobs of {chunks} chunks: min {min(ts)*1e6:.1f} us, median {np.median(ts)*1e6:.1f} us -> {min(ts)*1e6/56:.2f} us a job")
