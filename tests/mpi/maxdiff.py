# max |a - b| of one float dataset in two HDF5 files, read with h5dump (no h5py needed).
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from logprob_stats import values  # noqa: E402

a, b = values(sys.argv[1], sys.argv[3]), values(sys.argv[2], sys.argv[3])
assert len(a) == len(b), (len(a), len(b))
print(max((abs(x - y) for x, y in zip(a, b)), default=0.0))
