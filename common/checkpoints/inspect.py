"""What a checkpoint holds, read from its manifest alone: step, model, data, and per variable its shape,
dtype, slots and the files and tensor names it is stored under, then the shared variables (clients'
`Session.variable`, by container) (what `zmqflow checkpoint inspect` shows)."""

import json

from zmqflow.common.checkpoints.checkpoint import Checkpoint, find_checkpoint


def describe(directory):
    """A JSON-ready description of the checkpoint `directory` names."""
    ckpt = Checkpoint(find_checkpoint(directory))
    data = ckpt.config.get("data") if isinstance(ckpt.config.get("data"), dict) else {}
    spec = data.get("spec") if isinstance(data.get("spec"), dict) else {}
    pieces = {}
    for piece in ckpt.manifest["pieces"]:
        pieces.setdefault(piece["variable"], []).append(piece)
    files = ckpt.manifest.get("files") or {p["file"]: {"bytes": p["bytes"]} for p in ckpt.manifest["pieces"]}
    return {
        "path": ckpt.path, "step": ckpt.step, "format": ckpt.format, "num_shards": ckpt.num_shards,
        "model": ckpt.config.get("model"), "data": spec.get("name"),
        "bytes": sum(f["bytes"] for f in files.values()),
        "variables": [{"name": v.name, "shape": list(v.shape), "dtype": v.dtype, "slots": ckpt.slot_names(v.name),
                       "files": sorted({p["file"] for p in pieces[v.name]}),
                       "tensors": [p.get("tensor", p["file"]) for p in pieces[v.name]]}
                      for v in ckpt.variables()],
        "shared_variables": [{key: entry[key] for key in ("container", "name", "shape", "dtype", "file", "tensor")}
                             for entry in ckpt.manifest.get("shared", [])],
    }


def format_table(description):
    """The description as text: a heading, the model and data, then one row per variable."""
    d = description
    model = d["model"]
    lines = [f"{d['path']}: step {d['step']}, {d['format']}, {d['num_shards']} shard(s), {len(d['variables'])} "
             f"variables, {d['bytes']:,} bytes",
             f"model: {json.dumps(model, sort_keys=True) if model is not None else '(not recorded)'}",
             f"data:  {d['data'] or '(not recorded)'}"]
    header = ("variable", "shape", "dtype", "slots", "files")
    rows = [(v["name"], "[" + ", ".join(map(str, v["shape"])) + "]", v["dtype"], ", ".join(v["slots"]) or "-",
             ", ".join(v["files"])) for v in d["variables"]]
    widths = [max(len(r[i]) for r in [header, *rows]) for i in range(len(header))]
    lines.append("")
    for row in [header, *rows]:
        lines.append("  ".join(cell.ljust(w) for cell, w in zip(row, widths)).rstrip())
    shared = d.get("shared_variables") or []
    if shared:
        header = ("shared variable", "container", "shape", "dtype", "file")
        rows = [(v["name"], repr(v["container"]), "[" + ", ".join(map(str, v["shape"])) + "]", v["dtype"], v["file"])
                for v in shared]
        widths = [max(len(r[i]) for r in [header, *rows]) for i in range(len(header))]
        lines.append("")
        for row in [header, *rows]:
            lines.append("  ".join(cell.ljust(w) for cell, w in zip(row, widths)).rstrip())
    return "\n".join(lines)
