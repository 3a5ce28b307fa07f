"""Cells shared by the bench scripts' tables: a server's CPU per request, and statehub's
ratios to its peer (ops/s, p99, CPU per request). Imported by their embedded Python."""


def cells(row, peer):
    """(cpu, ops ratio, p99 ratio, cpu ratio) as table text; ratios empty without a peer."""
    cpu = row.get("cpu_us_per_request")
    cpu_text = "-" if cpu is None else f"{cpu:.1f} µs"
    ops = p99 = cpu_ratio = ""
    if peer and peer.get("ops") and row.get("ops"):
        ops = f"{row['ops'] / peer['ops']:.2f}x"
        if peer.get("p99_us") and row.get("p99_us"):
            p99 = f"{row['p99_us'] / peer['p99_us']:.2f}x"
        if peer.get("cpu_us_per_request") and cpu:
            cpu_ratio = f"{cpu / peer['cpu_us_per_request']:.2f}x"
    return cpu_text, ops, p99, cpu_ratio
