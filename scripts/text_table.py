"""A table as aligned text or as Markdown: shared by scripts/kernel_table.py and scaling_targets.py."""


def print_table(head, rows, markdown=False):
    rows = [tuple(str(c) for c in r) for r in rows]
    if markdown:
        print("| " + " | ".join(head) + " |")
        print("|" + "---|" * len(head))
        for r in rows:
            print("| " + " | ".join(r) + " |")
        return
    w = [max(len(x[i]) for x in rows + [tuple(head)]) for i in range(len(head))]
    for r in [tuple(head)] + rows:
        print("  ".join(c.ljust(w[i]) for i, c in enumerate(r)))
