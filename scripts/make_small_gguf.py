"""Write a smaller GGUF with real weights: the first L layers of a llama GGUF, with its embedding, final norm,
tokenizer and every metadata key (block_count set to L). Each tensor keeps its quantized type and its bytes.

    python scripts/make_small_gguf.py [--layers 8] [--model PATH] [-o smollm2-8-layers.gguf]

Why: a GPU machine with no network, sent at most 64 MiB of files per call, cannot receive the 98 MB default model;
the cut file can, and `scripts/gpu_check.py --model FILE` then compares GPU and CPU tokens and times decode on real
weights there. Its tokens are not the full model's (the last layers are gone): the CPU run of the same file is the
reference. The embedding (Q8_0) is most of the file; each SmolLM2 layer (Q4_1) adds about 2.2 MB.
"""

from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path

import gguf

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))                          # run from a checkout without installing

from minitransformer.models import find_default_model

LAYER = re.compile(r"blk\.(\d+)\.")                    # per-layer tensors: blk.<i>.attn_q.weight, ...


def make_small_gguf(source: str | Path, dest: str | Path, layers: int) -> Path:
    """Copy `source` into `dest` with only layers [0, layers): metadata first, then the tensors byte for byte."""
    reader = gguf.GGUFReader(source)
    arch = reader.fields["general.architecture"].contents()
    block_count_key = f"{arch}.block_count"
    total = int(reader.fields[block_count_key].contents())
    if not 1 <= layers <= total:
        raise ValueError(f"--layers must lie in [1, {total}] ({source} has {total} layers); got {layers}")
    writer = gguf.GGUFWriter(str(dest), arch)          # writes general.architecture itself
    for key, field in reader.fields.items():
        if key.startswith("GGUF.") or key == "general.architecture":    # the header: version and counts
            continue
        value = layers if key == block_count_key else field.contents()
        kind = gguf.GGUFValueType(field.types[0])
        sub = gguf.GGUFValueType(field.types[-1]) if kind == gguf.GGUFValueType.ARRAY else None
        writer.add_key_value(key, value, kind, sub_type=sub)
    for tensor in reader.tensors:
        match = LAYER.match(tensor.name)
        if match and int(match.group(1)) >= layers:
            continue
        # tensor.data: the stored bytes as (rows, bytes per row) uint8 for quantized types, float arrays otherwise;
        # raw_dtype keeps the type, and the writer recovers the element shape from the byte shape.
        writer.add_tensor(tensor.name, tensor.data, raw_dtype=tensor.tensor_type)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return Path(dest)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--layers", type=int, default=8, help="how many of the first layers to keep (default 8)")
    parser.add_argument("--model", default=None, help="the GGUF to cut (default: the default model, if on disk)")
    parser.add_argument("-o", "--output", default=None, help="where to write (default smollm2-<L>-layers.gguf)")
    args = parser.parse_args(argv)
    source = Path(args.model) if args.model else find_default_model()
    if source is None:
        print("make_small_gguf: the default model is not on disk; run `minitransformer download` or pass --model",
              file=sys.stderr)
        return 2
    dest = Path(args.output or f"smollm2-{args.layers}-layers.gguf")
    try:
        make_small_gguf(source, dest, args.layers)
    except ValueError as exc:
        print(f"make_small_gguf: {exc}", file=sys.stderr)
        return 2
    print(f"wrote {dest}: {args.layers} layers of {source.name}, {dest.stat().st_size / 2**20:.1f} MiB")
    return 0


if __name__ == "__main__":
    sys.exit(main())
