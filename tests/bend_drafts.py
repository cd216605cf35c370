#!/usr/bin/env python3
"""Oracle drafts for the speculative-decoding tests: a generate-mode output (OUT.h5: /generated,
/generated_offsets) with every fifth token or so changed (to a neighbouring id), written as
BENT.h5. Speculating with it (--speculative oracle --oracle-drafts BENT.h5) proposes drafts that
are accepted where unchanged and rejected where changed, so every layer's undo runs.

  python3 tests/bend_drafts.py OUT.h5 BENT.h5
"""
import sys

import h5py

with h5py.File(sys.argv[1], "r") as f:
    g, o = f["/generated"][:], f["/generated_offsets"][:]
b = g.copy()
for d in range(len(o) - 1):
    for j in range(o[d], o[d + 1]):
        if (7 * (j - o[d]) + d) % 5 == 2:
            b[j] = b[j] + 1 if b[j] == 0 else b[j] - 1
with h5py.File(sys.argv[2], "w") as f:
    f["/generated"], f["/generated_offsets"] = b, o
