# mean / median / max |a - b| of /logprobs in two output files (h5dump; no h5py needed).
import re
import statistics
import subprocess
import sys


def values(path, ds="/logprobs"):
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
