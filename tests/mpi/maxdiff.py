# max |a - b| of one float dataset in two HDF5 files, read with h5dump (no h5py needed).
import re, subprocess, sys

def values(path, ds):
    out = subprocess.run(["h5dump", "-d", ds, "-w", "0", "-m", "%.9g", path], capture_output=True, text=True,
                         check=True).stdout
    body = out[out.index("DATA {") + 6:]
    body = re.sub(r"\(\d+(,\d+)*\):", " ", body)
    return [float(x) for x in re.findall(r"[-+]?(?:\d+\.?\d*(?:[eE][-+]?\d+)?|inf|nan)", body.split("}")[0])]

a, b = values(sys.argv[1], sys.argv[3]), values(sys.argv[2], sys.argv[3])
assert len(a) == len(b), (len(a), len(b))
print(max((abs(x - y) for x, y in zip(a, b)), default=0.0))
