#!/usr/bin/env python3
"""tests/fuzz/gguf_seeds.py — seeds for fuzz_gguf, written at run time into
the corpus directory given (scripts/fuzz.sh passes its temporary copy): for
each GGUF file under $DOLPHIN_SHARED/models/gguf, its first MAX bytes (the
header, metadata and as much of the tensor table as fit) and a few shorter
truncations; and a small well-formed Llama GGUF of our own (F32, one layer,
an 8-piece tokenizer, 7 KB; and the same with Q8_0 or Q4_0 matrices),
whole and truncated. The shared files are read here,
never copied into the repository.

    python3 tests/fuzz/gguf_seeds.py CORPUS_DIR [MAX]
"""
import os
import struct
import sys
from pathlib import Path


def s(b):
    b = b.encode() if isinstance(b, str) else b
    return struct.pack("<Q", len(b)) + b


def kv_u32(k, v):
    return s(k) + struct.pack("<II", 4, v)


def kv_f32(k, v):
    return s(k) + struct.pack("<If", 6, v)


def kv_str(k, v):
    return s(k) + struct.pack("<I", 8) + s(v)


def kv_arr(k, t, items):
    head = s(k) + struct.pack("<IIQ", 9, t, len(items))
    if t == 8:
        return head + b"".join(s(x) for x in items)
    fmt = {6: "<f", 5: "<i"}[t]
    return head + b"".join(struct.pack(fmt, x) for x in items)


def block(qtype, i):
    """One block of 32 weights: Q8_0 (type 8) or Q4_0 (type 2), scale 1/64."""
    if qtype == 8:
        return struct.pack("<e", 1 / 64) + bytes(((i + j) * 37) % 256 for j in range(32))
    return struct.pack("<e", 1 / 64) + bytes(((i + j) * 29) % 256 for j in range(16))


def tiny_llama(qtype=0):
    """d 16, 2 heads of 8, 1 KV head, FFN 16, 1 layer, 8 tokens; F32 (7 KB).
    With qtype 8 or 2: d 32, 4 heads of 8, FFN 32, the matrices Q8_0 or
    Q4_0 (the norms F32)."""
    d, nh, hd, nkv, ff, nv = (32, 4, 8, 1, 32, 8) if qtype else (16, 2, 8, 1, 16, 8)
    toks = ["<unk>", "<s>", "</s>", "\u2581", "a", "b", "\u2581a", "\u2581b"]
    kvs = [kv_str("general.architecture", "llama"), kv_u32("llama.context_length", 64),
           kv_u32("llama.embedding_length", d), kv_u32("llama.block_count", 1),
           kv_u32("llama.feed_forward_length", ff), kv_u32("llama.attention.head_count", nh),
           kv_u32("llama.attention.head_count_kv", nkv),
           kv_f32("llama.attention.layer_norm_rms_epsilon", 1e-5),
           kv_str("tokenizer.ggml.model", "llama"), kv_arr("tokenizer.ggml.tokens", 8, toks),
           kv_arr("tokenizer.ggml.scores", 6, [0, 0, 0, -1, -2, -3, -4, -5]),
           kv_arr("tokenizer.ggml.token_type", 5, [2, 3, 3, 1, 1, 1, 1, 1])]
    tensors = [("token_embd.weight", [d, nv]), ("blk.0.attn_norm.weight", [d]),
               ("blk.0.attn_q.weight", [d, nh * hd]), ("blk.0.attn_k.weight", [d, nkv * hd]),
               ("blk.0.attn_v.weight", [d, nkv * hd]), ("blk.0.attn_output.weight", [nh * hd, d]),
               ("blk.0.ffn_norm.weight", [d]), ("blk.0.ffn_gate.weight", [d, ff]),
               ("blk.0.ffn_up.weight", [d, ff]), ("blk.0.ffn_down.weight", [ff, d]),
               ("output_norm.weight", [d])]
    out = b"GGUF" + struct.pack("<IQQ", 3, len(tensors), len(kvs)) + b"".join(kvs)
    off, data = 0, b""
    for name, ne in tensors:
        n = 1
        for x in ne:
            n *= x
        out += s(name) + struct.pack("<I", len(ne)) + b"".join(struct.pack("<Q", x) for x in ne)
        t = qtype if qtype and len(ne) == 2 else 0
        out += struct.pack("<IQ", t, off)
        if t:
            blob = b"".join(block(t, i) for i in range(n // 32))
        else:
            blob = struct.pack(f"<{n}f", *[((i * 7) % 13) / 64.0 for i in range(n)])
        blob += b"\0" * (-len(blob) % 32)
        data += blob
        off += len(blob)
    out += b"\0" * (-len(out) % 32)
    return out + data


def main():
    corpus = Path(sys.argv[1])
    limit = int(sys.argv[2]) if len(sys.argv) > 2 else 16384
    corpus.mkdir(parents=True, exist_ok=True)
    seeds = {"tiny-llama.gguf": tiny_llama(), "tiny-llama-q8_0.gguf": tiny_llama(8),
             "tiny-llama-q4_0.gguf": tiny_llama(2)}
    shared = Path(os.environ.get("DOLPHIN_SHARED", Path(__file__).resolve().parents[2].parent / "shared"))
    for f in sorted((shared / "models" / "gguf").glob("*.gguf")):
        with open(f, "rb") as fh:
            seeds[f.stem + ".head"] = fh.read(limit)
    n = 0
    for name, b in seeds.items():
        b = b[:limit]
        for cut in (len(b), len(b) // 2, len(b) // 7, 200, 40, 23):
            if cut <= len(b):
                (corpus / f"{name}.{cut}").write_bytes(b[:cut])
                n += 1
    print(f"gguf_seeds: {n} seeds from {len(seeds)} files into {corpus}")


if __name__ == "__main__":
    main()
