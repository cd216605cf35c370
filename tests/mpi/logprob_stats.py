# mean / median / max |a - b| of /logprobs in two output files (h5dump; h5py where it is missing).
import re
import shutil
import statistics
import subprocess
import sys


def values(path, ds="/logprobs"):
    if shutil.which("h5dump") is None:  # (the GPU nodes have h5py but no hdf5-tools)
        import h5py
        with h5py.File(path, "r") as f:
            return [float(x) for x in f[ds][()].reshape(-1)]
    out = subprocess.run(["h5dump", "-d", ds, "-w", "0", "-m", "%.9g", path], capture_output=True, text=True,
                         check=True).stdout
    body = out[out.index("DATA {") + 6:]
    body = re.sub(r"\(\d+(,\d+)*\):", " ", body)
    return [float(x) for x in re.findall(r"[-+]?(?:\d+\.?\d*(?:[eE][-+]?\d+)?|inf|nan)", body.split("}")[0])]


if __name__ == "__main__":
    a, b = values(sys.argv[1]), values(sys.argv[2])
    assert len(a) == len(b), (len(a), len(b))
    d = [abs(x - y) for x, y in zip(a, b)]
    print(f"{statistics.mean(d):.3g} {statistics.median(d):.3g} {max(d):.3g}")
