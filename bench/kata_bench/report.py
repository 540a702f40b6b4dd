"""Statistics and reporting: median and min-max per figure, the table with its footnotes."""

import statistics


def summary(values):
    vals = [v for v in values if v is not None]
    if not vals:
        return None
    return {"median": statistics.median(vals), "min": min(vals), "max": max(vals),
            "n": len(vals), "values": vals}


class Report:
    def __init__(self):
        self.rows = []  # (section, key, label, unit, {side: summary or None}, failures, how)
        self.notes = []

    def add(self, section, key, label, unit, how, kata=None, runc=None, failed=None,
            single=False):
        sides = {}
        if kata is not None:
            sides["kata"] = summary(kata)
        if runc is not None:
            sides["runc"] = summary(runc)
        self.rows.append({"section": section, "key": key, "label": label, "unit": unit,
                          "how": how, "figures": sides, "failed": failed or {},
                          "single_side": single})


def fmt_num(v, unit):
    if v is None:
        return "-"
    if unit in ("ms",):
        return "%.0f" % v
    if unit in ("count",):
        return "%.0f" % v
    return "%.1f" % v


def fmt_cell(s, unit, failed):
    if s is None:
        txt = "n/a"
    else:
        lo, mid, hi = (fmt_num(s[k], unit) for k in ("min", "median", "max"))
        txt = mid if lo == hi else "%s [%s..%s]" % (mid, lo, hi)
    if failed:
        txt += " (%d failed)" % failed
    return txt


def print_table(report, header):
    """The table, one row per figure, each pointing at a footnote that says how it was measured."""
    cells = []
    for r in report.rows:
        f = r["figures"]
        kc = fmt_cell(f["kata"], r["unit"], r["failed"].get("kata")) if "kata" in f else ""
        uc = fmt_cell(f["runc"], r["unit"], r["failed"].get("runc")) if "runc" in f else ""
        cells.append(("%s (%s)" % (r["label"], r["unit"]), kc, uc))
    w = [max([len(h)] + [len(c[i]) for c in cells])
         for i, h in enumerate(("figure", "kata (ours)", "runc"))]
    fmt = "%%-%ds  %%-%ds  %%-%ds  %%s" % tuple(w)
    out = [header, "", fmt % ("figure", "kata (ours)", "runc", "how")]
    section = None
    for n, (r, c) in enumerate(zip(report.rows, cells), 1):
        if r["section"] != section:
            section = r["section"]
            out.append("-- " + section)
        out.append((fmt % (c + ("[%d]" % n,))).rstrip())
    out.append("")
    out.append("median [min..max] over the runs; MB = 10^6 bytes, MiB = 2^20 bytes; how:")
    first = {}
    for n, r in enumerate(report.rows, 1):
        if r["how"] in first:
            out.append("[%d] as [%d]" % (n, first[r["how"]]))
        else:
            first[r["how"]] = n
            out.append("[%d] %s" % (n, r["how"]))
    for n in report.notes:
        out.append("note: " + n)
    text = "\n".join(out)
    print(text, flush=True)
    return text


