"""CLI: `overlay inspect PATH|REPO [--json]` (thin: parse, call inspect_checkpoint, render to stdout)."""

from __future__ import annotations

import click

from ..console import print_data, print_json


def _n(b: int) -> str:
    return f"{b:,} B ({b / 1e9:.2f} GB)"


def render(r) -> str:
    """The inspection as plain text (data: stdout, no markup; names come from the checkpoint, printed verbatim)."""
    p = r.profile
    lines = [f"checkpoint  {r.source}: {len(r.shards)} shard(s), {r.weights.tensors} tensors; "
             f"read {r.bytes_read:,} bytes (JSON files + headers, no tensor data)"]
    moe = p.get("moe")
    lines.append(f"model       {p['family']} {p['architecture']}: hidden {p['hidden_size']}, {p['num_layers']} layers, "
                 f"{p['num_attention_heads']} heads, vocab {p['vocab_size']}, max ctx {p['max_context']}"
                 + (f", MoE {moe['experts']} experts top-{moe['top_k']} "
                    f"(expert intermediate {moe['expert_intermediate_size']})"
                    if moe else f", intermediate {p.get('intermediate_size')}"))
    groups = []
    for g in p["layer_groups"]:
        s = f"{g['name']} x{g['count']}: {g['kv_heads']} KV heads, head_dim {g['head_dim']}"
        if g.get("window"):
            s += f", window {g['window']}"
        if g.get("k_eq_v"):
            s += ", K=V"
        if g.get("kv_shared"):
            s += f", {g['kv_shared']} KV-shared"
        groups.append(s)
    lines.append("layers      " + " | ".join(groups))
    q = r.quant
    if q.method == "none":
        lines.append(f"quant       none ({q.scheme})")
    else:
        head = f"quant       {q.method}" + (f" {q.format}" if q.format else "") + f": {q.scheme}"
        if q.bits:
            head += f", {q.bits}-bit"
        if q.group_size is not None:
            head += f", group {q.group_size}"
        if q.symmetric is not None:
            head += ", symmetric" if q.symmetric else ", asymmetric"
        lines.append(head)
        for g in q.groups:
            lines.append(f"            {g.name}: targets {', '.join(g.targets) or '-'}; "
                         f"weights {g.type}{g.bits}, strategy {g.strategy}, "
                         f"group_size {g.group_size}, symmetric {g.symmetric}"
                         + (f"; activations {g.activations}" if g.activations else "; weight-only"))
        if q.ignore:
            lines.append(f"            ignore: {', '.join(q.ignore)}")
        for k, v in q.extra.items():
            lines.append(f"            {k}: {v}")
    if q.quantized_classes:
        lines.append("            quantized: " + ", ".join(f"{c} ({n})" for c, n in q.quantized_classes))
    if q.method != "none" and q.unquantized_classes:
        lines.append("            not quantized: " + ", ".join(f"{c} ({n})" for c, n in q.unquantized_classes))
    w = r.weights
    lines.append(f"weights     {_n(w.total)}, measured from headers; by dtype: "
                 + ", ".join(f"{d} {b:,}" for d, b in sorted(w.by_dtype.items(), key=lambda kv: -kv[1])))
    width = max((len(c.cls) for c in w.by_class), default=10)
    lines.append(f"  {'class':<{width}}  {'rule':<10}  {'tensors':>7}  {'bytes':>15}")
    for c in w.by_class:
        extra = (f"  split dim {','.join(map(str, c.dims))}" if c.dims else "") + (f"  ({c.why})" if c.why else "")
        lines.append(f"  {c.cls:<{width}}  {c.rule:<10}  {c.tensors:>7}  {c.bytes:>15,}{extra}")
    from ..inspect.tensors import RULES

    lines.append("  rules: " + "; ".join(f"{k} = {RULES[k]}" for k in sorted({c.rule for c in w.by_class})))
    lines.append(f"per rank    TP allowed by heads: {list(w.head_valid_tps)}")
    for s in w.tp:
        if s.valid:
            lines.append(f"  TP {s.tp}: {s.ranks[0]:,} B per rank x {s.tp} "
                         f"(sharded {s.sharded:,} / {s.tp} + replicated {s.replicated:,})"
                         + (f"; +{s.k_eq_v_copy:,} B when vLLM copies K into V on K=V layers" if s.k_eq_v_copy else ""))
        else:
            lines.append(f"  TP {s.tp}: not loadable: " + "; ".join(s.problems))
    if r.findings:
        lines.append("findings")
        for f in r.findings:
            lines.append(f"  [{f.severity}] {f.id}: {f.message}")
            if f.keys:
                more = f" (+{f.count - len(f.keys)} more)" if f.count > len(f.keys) else ""
                lines.append(f"      keys: {', '.join(f.keys)}" + more)
            if f.source:
                lines.append(f"      source: {f.source}")
    if r.engines:
        lines.append("engines")
        for e in r.engines:
            s = f"  {e.engine:<12} vLLM {e.vllm_version:<7} transformers {e.transformers_version:<7} {e.result}"
            if e.overlays:
                s += ": " + ", ".join(e.overlays)
            lines.append(s)
            for fl in e.failures:
                lines.append(f"      predicted failure: {fl.message}")
                lines.append(f"        source: {fl.source}")
            for nt in e.notes:
                lines.append(f"      {nt}")
    for nt in r.notes:
        lines.append(f"note        {nt}")
    return "\n".join(lines) + "\n"


@click.command("inspect")
@click.argument("target")
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
@click.option("--revision", default="main", show_default=True, help="Hub revision (repo ids only).")
@click.option("--endpoint", default=None, help="Hub endpoint for repo ids (default $HF_ENDPOINT or https://huggingface.co).")
@click.pass_context
def inspect_cmd(ctx: click.Context, target: str, as_json: bool, revision: str, endpoint: str | None) -> None:
    """Read a checkpoint's config.json and safetensors headers (never its tensor data): model facts,
    quantization, exact weight bytes per TP rank, and what each engine profile will do with its keys.

    TARGET is a checkpoint directory, an http(s) URL of one, or a Hugging Face repo id (range requests)."""
    from ..inspect import inspect_checkpoint
    from ..profiles import load_profiles

    result = inspect_checkpoint(target, profiles=load_profiles(ctx.obj.catalog), catalog=ctx.obj.catalog,
                                revision=revision, endpoint=endpoint)
    if as_json:
        print_json(result.to_json())
    else:
        print_data(render(result))


def register(cli: click.Group) -> None:
    """Add this area's commands to the root `overlay` group."""
    for cmd in (inspect_cmd,):
        cli.add_command(cmd)
