"""Reading the tables of a profile's summary (shim/profiling/report.py) back, as printed by
``python -m shim profile`` and the demo."""


def table(text: str, title: str) -> tuple[str, list[dict]]:
    """The summary table whose title starts with ``title``: (its title line, its rows as
    {column: cell}), cut by the dashes under the header (cells may hold spaces; the columns
    are two spaces apart)."""
    lines = text.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith(title))
    header, dashes = lines[start + 1], lines[start + 2]
    spans, at = [], 0
    for dash in dashes.split("  "):
        spans.append((at, at + len(dash)))
        at += len(dash) + 2
    names = [header[a:b].strip() for a, b in spans]
    rows = []
    for line in lines[start + 3:]:
        if not line.strip() or any(line[b:b + 2].strip() for _, b in spans[:-1]):
            break  # the table's end: a blank line, or a line not in its columns
        rows.append({name: line[a:b].strip() for name, (a, b) in zip(names, spans)})
    return lines[start], rows
