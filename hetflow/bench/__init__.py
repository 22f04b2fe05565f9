"""``hetflow bench``: the seed papers' experiments, reproduced as named targets.

Each target measures configurations side by side in one process (interleaved, each warmed up first,
minimum and median over the repetitions) and returns a ``BenchResult``: a table, written as Markdown
and JSON, and a plot, written as PNG (with matplotlib) or SVG (without). Targets:

=================  ==========================================================================
``matmul``         square MatMul 64...2048: CPU device vs OpenCL device (RSTensorFlow Fig. 2)
``conv``           GoogLeNet's convolution shapes on a 224x224 input, CPU vs OpenCL (Fig. 3)
``placements``     googlenet at batch 1-5: CPU only, OpenCL MatMul+Conv, OpenCL MatMul only (Table 2)
``lstm``           lstm-gesture at batch 1 and 64, CPU vs OpenCL (RSTensorFlow Table 3)
``cnndroid``       lenet, cifar10-quick, alexnet at batch 16, per image: sequential vs parallel vs
                   OpenCL (CNNdroid Fig. 8)
``train``          mentee SGD step at batch 128: forward / backward / update, hetflow CPU vs PyTorch
                   CPU (when installed), peak step memory (TensorFlow+)
``train-scaling``  conv-only networks by depth and width: step time, hetflow vs PyTorch (TensorFlow+ Fig. 2)
=================  ==========================================================================
"""

from hetflow.bench.results import BenchResult, Series
from hetflow.bench.targets import TARGETS, Options, Target, run_target

__all__ = ["TARGETS", "BenchResult", "Options", "Series", "Target", "run_target"]
