#!/usr/bin/env python3
"""tests/fuzz/make_corpus.py — writes the seed corpus of the fuzz targets
into tests/fuzz/corpus/<target>/ (deterministic; run it again after changing
it and commit the result). Reproducers of fixed bugs are kept as
tests/fuzz/corpus/<target>/crash-*; this script leaves those alone.

    python3 tests/fuzz/make_corpus.py
"""
import json
import struct
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]
CORPUS = HERE / "corpus"


def write(target, name, data):
    d = CORPUS / target
    d.mkdir(parents=True, exist_ok=True)
    if isinstance(data, str):
        data = data.encode()
    (d / name).write_bytes(data)


# ---- fuzz_request: request bodies ------------------------------------------
def request_seeds():
    full = {
        "model": "stories260K", "prompt": ["Once upon", "a time"], "max_tokens": 8,
        "temperature": 0.7, "top_p": 0.9, "top_k": 40, "min_p": 0.05,
        "presence_penalty": 0.5, "frequency_penalty": -0.5, "repetition_penalty": 1.1,
        "logit_bias": {"13": -100, "42": 5.5}, "n": 2, "best_of": 2,
        "stop": ["\n", "The end"], "stream": True, "stream_options": {"include_usage": True},
        "seed": -42, "logprobs": 5, "echo": True, "ignore_eos": False, "user": "u1",
    }
    nested = "[" * 60 + "]" * 60
    seeds = {
        "simple.json": {"prompt": "Once upon a time", "max_tokens": 16},
        "all_fields.json": full,
        "token_ids.json": {"prompt": [1, 403, 407, 261, 378], "max_tokens": 4, "temperature": 0},
        "token_batches.json": {"prompt": [[1, 2, 3], [4, 5]], "n": 1},
        "echo_zero.json": {"prompt": "x", "max_tokens": 0, "echo": True, "logprobs": 0},
        "unknown_fields.json": {"prompt": "x", "foo": {"bar": [1, 2, {"baz": None}]},
                                "functions": []},
        "nulls.json": {"prompt": "x", "max_tokens": None, "stop": None, "seed": None,
                       "stream_options": None},
        "bad_max_tokens.json": {"prompt": "x", "max_tokens": -1},
        "bad_n.json": {"prompt": "x", "n": 17},
        "bad_stop.json": {"prompt": "x", "stop": ["a", "b", "c", "d", "e"]},
        "bad_types.json": {"prompt": "x", "temperature": "hot", "stream": 1},
        "context.json": {"prompt": [1] * 500, "max_tokens": 100},
        "big_numbers.json": {"prompt": "x", "seed": 18446744073709551615, "max_tokens": 1e300,
                             "top_k": -1},
        "logit_bias_keys.json": {"prompt": "x", "logit_bias": {"00012": 1, "-1": 2, "1e3": 0}},
        "stream_options_only.json": {"prompt": "x", "stream_options": {"include_usage": False}},
        "chat.json": {"messages": [{"role": "system", "content": "Be brief."},
                                   {"role": "user", "content": "Hi <s> there"},
                                   {"role": "assistant", "content": " Hello! "},
                                   {"role": "user", "content": [{"type": "text", "text": "a"},
                                                                {"type": "text", "text": "b"}]}],
                      "max_completion_tokens": 8, "logprobs": True, "top_logprobs": 2,
                      "stream": True, "stream_options": {"include_usage": True}},
        "chat_bad_order.json": {"messages": [{"role": "assistant", "content": None},
                                             {"role": "user", "content": "x"},
                                             {"role": "user", "content": "y"}]},
        "chat_tools.json": {"messages": [{"role": "developer", "content": "x"},
                                         {"role": "user", "content": "y"}],
                            "tools": [], "tool_choice": "auto",
                            "response_format": {"type": "text"}},
        "json_object.json": {"prompt": "x", "max_tokens": 8,
                             "response_format": {"type": "json_object"}},
        "json_schema.json": {"messages": [{"role": "user", "content": "x"}], "response_format": {
            "type": "json_schema", "json_schema": {"name": "t", "strict": True, "schema": {
                "$defs": {"n": {"type": "object", "properties": {
                    "v": {"type": ["integer", "null"], "minimum": -5, "maximum": 99},
                    "k": {"type": "array", "items": {"$ref": "#/$defs/n"}, "maxItems": 2}},
                    "required": ["v"], "additionalProperties": False}},
                "type": "object", "properties": {
                    "s": {"type": "string", "minLength": 1, "maxLength": 4},
                    "e": {"enum": ["a", 1, None, [1]]}, "u": {"type": "string", "format": "uuid"},
                    "t": {"$ref": "#/$defs/n"},
                    "o": {"oneOf": [{"type": "string"}, {"type": "number"}]},
                    "m": {"allOf": [{"properties": {"x": {"const": True}}}, {"required": ["x"]}]},
                    "p": {"type": "array", "prefixItems": [{"type": "boolean"}], "items": False}},
                "required": ["s", "t"], "additionalProperties": {"type": "number"}}}}},
        "json_schema_refused.json": {"prompt": "x", "response_format": {
            "type": "json_schema", "json_schema": {"schema": {
                "type": "object", "properties": {"a": {"type": "string", "pattern": "x"}}}}}},
        "tokenize.json": {"prompt": "Once upon a time", "add_special_tokens": False},
        "tokenize_messages.json": {"messages": [{"role": "user", "content": "hi"}]},
        "detokenize.json": {"tokens": [1, 403, 407, 511], "model": "stories260K"},
        # at and past the lowered limits of fuzz_request.c
        "limits_at.json": {"prompt": "x", "n": 4, "best_of": 4, "max_tokens": 256,
                           "stop": ["a" * 32, "b", "c"],
                           "logit_bias": {str(i): 1 for i in range(20)}},
        "limits_over.json": {"prompt": "x", "n": 5, "max_tokens": 257, "stop": "a" * 33,
                             "logit_bias": {str(i): 1 for i in range(21)}},
        "chat_cap.json": {"messages": [{"role": "user", "content": "x"}],
                          "max_completion_tokens": 257},
        "long_prompt.json": {"prompt": "Once upon a time, there was a little girl. " * 100,
                             "max_tokens": 4},
        "long_chat.json": {"messages": [{"role": "user", "content": "Lily  likes to play. " * 150}]},
        "spaces_prompt.json": {"prompt": " " * 3000 + "x \u2581\u2581 y", "max_tokens": 1},
    }
    for name, obj in seeds.items():
        write("fuzz_request", name, json.dumps(obj))
    raw = {
        "unicode.json": '{"prompt":"caf\\u00e9 \\ud83d\\udc2c \u4e16\u754c","stop":"\\u2028"}',
        "lone_surrogate.json": '{"prompt":"\\ud83d x"}',
        "nul_escape.json": '{"prompt":"a\\u0000b"}',
        "nul_escaped_backslash.json": '{"prompt":"a\\\\u0000b"}',
        "trailing_comma.json": '{"prompt": "x",}',
        "not_object.json": '[1,2,3]',
        "duplicate_keys.json": '{"prompt":"a","prompt":[1]}',
        "trailing_bytes.json": '{"prompt":"x"} trailing',
        "whitespace.json": ' \n\t{"prompt" : "x" } \r\n',
        "deep.json": '{"prompt":"x","extra":' + nested + '}',
        "depth_16.json": '{"prompt":"x","e":' + "[" * 15 + '"[[\\"{{\\\\"' + "]" * 15 + '}',
        "depth_17.json": '{"prompt":"x","e":' + "[" * 16 + '"]]\\"}}"' + "]" * 16 + '}',
        "empty.json": '',
    }
    for name, text in raw.items():
        write("fuzz_request", name, text)
    write("fuzz_request", "invalid_utf8.json", b'{"prompt":"\xc3\x28 \xed\xa0\x80"}')


# ---- fuzz_safetensors: whole .safetensors files ------------------------------
DSIZE = {"F64": 8, "F32": 4, "F16": 2, "BF16": 2, "I8": 1, "U8": 1, "BOOL": 1, "I64": 8}


def safetensors(tensors, metadata=None, pad_to=8, extra=b""):
    """tensors: list of (name, dtype, shape); data laid out in order."""
    header, off = {}, 0
    if metadata is not None:
        header["__metadata__"] = metadata
    for name, dtype, shape in tensors:
        n = DSIZE[dtype]
        for s in shape:
            n *= s
        header[name] = {"dtype": dtype, "shape": shape, "data_offsets": [off, off + n]}
        off += n
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * (-len(text) % pad_to)
    data = bytes((i * 7 + 3) & 0xFF for i in range(off))
    return struct.pack("<Q", len(text)) + text + data + extra


def raw_safetensors(header_text, data=b""):
    h = header_text.encode()
    return struct.pack("<Q", len(h)) + h + data


def safetensors_seeds():
    w = lambda name, data: write("fuzz_safetensors", name, data)
    w("one_f32.st.raw", safetensors([("model.embed_tokens.weight", "F32", [2, 3])]))
    w("mixed.st.raw", safetensors(
        [("model.norm.weight", "F16", [4]), ("lm_head.weight", "BF16", [2, 4]),
         ("model.layers.0.self_attn.q_proj.weight", "F32", [4, 4])],
        metadata={"format": "pt"}))
    w("zero_and_scalar.st.raw", safetensors(
        [("empty", "F32", [0, 4]), ("scalar", "F32", []), ("after", "F16", [3])]))
    w("other_dtypes.st.raw", safetensors(
        [("a", "I8", [5]), ("b", "U8", [2, 2]), ("c", "BOOL", [3]), ("d", "F64", [1]),
         ("e", "I64", [2])]))
    w("eight_dims.st.raw", safetensors([("t", "F16", [1, 2, 1, 2, 1, 2, 1, 2])]))
    w("empty_header.st.raw", raw_safetensors("{}"))
    w("metadata_only.st.raw", raw_safetensors('{"__metadata__":{"a":"b"}}'))
    w("overlap.st.raw", raw_safetensors(
        '{"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},'
        '"b":{"dtype":"F32","shape":[2],"data_offsets":[4,12]}}', bytes(12)))
    w("past_end.st.raw", raw_safetensors(
        '{"a":{"dtype":"F32","shape":[4],"data_offsets":[0,16]}}', bytes(8)))
    w("wrong_size.st.raw", raw_safetensors(
        '{"a":{"dtype":"F16","shape":[3],"data_offsets":[0,8]}}', bytes(8)))
    w("huge_shape.st.raw", raw_safetensors(
        '{"a":{"dtype":"F32","shape":[4294967296,4294967296],"data_offsets":[0,0]}}'))
    w("duplicate.st.raw", raw_safetensors(
        '{"a":{"dtype":"U8","shape":[1],"data_offsets":[0,1]},'
        '"a":{"dtype":"U8","shape":[1],"data_offsets":[1,2]}}', bytes(2)))
    w("bad_json.st.raw", raw_safetensors('{"a":{"dtype":"F32",'))
    w("header_too_long.st.raw", struct.pack("<Q", 1 << 40) + b"{}")
    w("short.st.raw", b"\x02\x00\x00")


# ---- fuzz_config: YAML files, or 0x00 + one argument per line ----------------
def config_seeds():
    w = lambda name, data: write("fuzz_config", name, data)
    w("dolphin.yaml", (REPO / "configs" / "dolphin.yaml").read_text())
    w("small.yaml", "port: 9000\nmax_body_bytes: 64KiB\nthreads: 2\napi_keys:\n"
      "  - {key: abc, priority: 3}\n  - key: def\n")
    w("flow.yaml", "{host: 0.0.0.0, threads: 4, backend: CPU, warmup: off, top_p: 0.5}\n")
    w("alias.yaml", "port: &p 8081\nthreads: *p\n")
    w("null_values.yaml", "served_model_name: ~\nmodel:\n")
    w("two_docs.yaml", "port: 1\n---\nport: 2\n")
    w("bad_range.yaml", "port: 99999\nmax_batch_size: 0\n")
    w("kv_cache.yaml", "kv_cache_dtype: q8_0\nkv_cache_dtype_v: f16\nmodels:\n"
      "  - {name: a, path: /m/a, kv_cache_dtype_k: q8_0}\n  - {name: b, path: /m/b, kv_cache_dtype: q4}\n")
    w("bad_type.yaml", "max_batch_size: [1]\n")
    w("sequence.yaml", "- a\n- b\n")
    w("dashed_key.yaml", "max-batch-size: 4\n")
    w("sizes.yaml", "max_body_bytes: 1 GiB\nkv_cache_bytes: 512MB\n")
    w("connections.yaml", "max_connections: 64\nmax_connections_per_ip: 8\n"
      "connection_timeout_s: 0\n")
    w("args.raw", b"\x00--port\n9000\n--api-key\nk1:5\n--no-warmup\n--max-body-bytes=2MiB\n"
      b"--temperature\n0.5")
    w("args_bad.raw", b"\x00--port\nabc\n--frobnicate\n")
    w("args_help.raw", b"\x00--help")


# ---- fuzz_detok: byte 0 picks the tokenizer, then two bytes per token --------
SEP = b"\xc0\x00"
BOS, EOS, UNK, BAD_HI, BAD_LO = b"\x80\x00", b"\x80\x01", b"\x80\x02", b"\x80\x0b", b"\x80\x07"


def tid(i):
    """A normal id (< 16384 before the separator; any id after it)."""
    if i < 16384:
        return bytes([i >> 8, i & 0xFF])
    j = i - 16384
    return bytes([0xC0 | (j >> 8), j & 0xFF])


def byt(*bs):
    return b"".join(bytes([0x40, b]) for b in bs)


def detok_seeds():
    # piece ids: stories260K / tiny-llama2 (Llama-2's tokenizer)
    ids = {0: {"Once": 403, "upon": 407, "a": 261, "time": 378, "the": 265, ".": 426},
           1: {"Once": 9038, "upon": 2501, "a": 263, "time": 931, "the": 278, ".": 29889}}
    for t, p in ids.items():
        w = lambda name, data: write("fuzz_detok", f"{name}_{t}.raw", bytes([t]) + data)
        w("words", BOS + tid(p["Once"]) + SEP + tid(p["upon"]) + tid(p["a"]) + tid(p["time"])
          + tid(p["."]) + EOS)
        w("emoji_bytes", BOS + SEP + byt(0xF0, 0x9F, 0x90, 0xAC) + tid(p["the"]))
        w("prompt_tail_completed", BOS + byt(0xE4, 0xB8) + SEP + byt(0x96, 0x41))
        w("prompt_tail_broken", BOS + byt(0xE4) + SEP + byt(0x41) + tid(p["the"]))
        w("invalid_bytes", SEP + byt(0xFF, 0xC0, 0x80, 0xED, 0xA0, 0x80, 0xF4, 0x90, 0x80, 0x80))
        w("empty_prompt", SEP + tid(p["the"]) + tid(p["a"]))
        w("no_separator", tid(p["the"]) + byt(0xC3, 0xA9) + tid(p["."]))
        w("invalid_ids", BOS + SEP + tid(p["a"]) + BAD_HI + BAD_LO + tid(p["time"]))
        w("invalid_prompt", BOS + BAD_HI + SEP + tid(p["a"]))
        w("controls", BOS + SEP + BOS + EOS + UNK + byt(0xE2, 0x82) + EOS + byt(0xAC))
        w("long_byte_run", BOS + SEP + byt(*b"\xe4\xb8\x96\xe7\x95\x8c \xf0\x9f\x90\xac!"))


if __name__ == "__main__":
    request_seeds()
    safetensors_seeds()
    config_seeds()
    detok_seeds()
    for d in sorted(CORPUS.iterdir()):
        print(f"{d.relative_to(REPO)}: {len(list(d.iterdir()))} files")
