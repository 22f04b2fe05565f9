import sys, time, tempfile, numpy as np, onnx
sys.path.insert(0, '/work/main/benchmarks')
from lstm_one_column import lstm_model
import hetflow
from hetflow.devices.cpu.kernels import jit_lstm
hidden = int(sys.argv[1]) if len(sys.argv) > 1 else 512
path = tempfile.mktemp(suffix='.onnx'); onnx.save(lstm_model(100, hidden), path)
feeds = {"x": np.random.default_rng(1).standard_normal((100, 1, 6)).astype(np.float32)}
s = hetflow.InferenceSession(path, threads=2)
s.run(None, feeds)
ts=[]
for i in range(60):
    t=time.perf_counter(); s.run(None, feeds); ts.append(time.perf_counter()-t)
print(hidden, 'min %.3f med %.3f ms' % (min(ts)*1e3, np.median(ts)*1e3))
import cProfile, pstats
pr=cProfile.Profile(); pr.enable()
for i in range(20): s.run(None, feeds)
pr.disable(); pstats.Stats(pr).sort_stats('tottime').print_stats(12)
