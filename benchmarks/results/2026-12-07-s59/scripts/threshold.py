import sys, tempfile
from pathlib import Path
sys.path.insert(0, '/work/main/benchmarks')
import lstm_one_column as b
from hetflow.devices.cpu.kernels import jit_lstm
jit_lstm.VECTOR_MIN_BYTES = 0
folder = Path(tempfile.mkdtemp())
for hidden in (32, 48, 64, 96, 128):
    row = b.measure(hidden, folder, 100, 30, 2)
    print(hidden, {k: round(v, 3) if isinstance(v, float) else v for k, v in row.items()})
