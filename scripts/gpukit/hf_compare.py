#!/usr/bin/env python3
"""hf_compare.py — part of step 5 of the GPU kit's run.sh: Dolphin's
last-position logits (written by dol-check-backends --logits-out) against
Hugging Face transformers' LlamaForCausalLM on the same checkpoint and the
same prompt ids, the reference computed in float32 (on the GPU when torch
sees one). Passes when the CUDA backend's logits are within --tol of the
reference at every vocabulary entry (FP16 weights and FP16 product inputs
against an FP32 forward pass). Prints one RESULT line; exit 0 pass, 1 fail,
3 when torch or transformers is missing (run.sh reports n/a)."""
import argparse
import json
import sys


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("model")
    ap.add_argument("logits_json")
    ap.add_argument("--tol", type=float, default=0.05)
    args = ap.parse_args()
    try:
        import torch
        from transformers import LlamaForCausalLM
    except ImportError as e:
        print(f"RESULT n/a ({e})")
        return 3
    d = json.load(open(args.logits_json))
    dev = "cuda" if torch.cuda.is_available() else "cpu"
    torch.backends.cuda.matmul.allow_tf32 = False  # a float32 reference, not TF32
    torch.backends.cudnn.allow_tf32 = False
    try:  # transformers 5 names it dtype, 4 torch_dtype
        model = LlamaForCausalLM.from_pretrained(args.model, dtype=torch.float32)
    except TypeError:
        model = LlamaForCausalLM.from_pretrained(args.model, torch_dtype=torch.float32)
    model = model.to(dev).eval()
    ids = torch.tensor([d["prompt_ids"]], device=dev)
    with torch.no_grad():
        ref = model(ids).logits[0, -1].double().cpu()
    out = [f"device={dev}"]
    ok = True
    for name in ("cuda", "cpu"):
        got = torch.tensor(d[f"{name}_last_logits"], dtype=torch.float64)
        if got.shape != ref.shape:
            print(f"RESULT FAIL: {name} logits have {got.shape[0]} entries, transformers {ref.shape[0]}")
            return 1
        diff = (got - ref).abs()
        dmax = float(diff.max()) if torch.isfinite(got).all() else float("nan")
        rel = float((got - ref).norm() / ref.norm())
        same = int(got.argmax()) == int(ref.argmax())
        out.append(f"{name}: max|d|={dmax:.5f} rel={rel:.2e} argmax_equal={'yes' if same else 'no'}")
        if name == "cuda" and not (dmax <= args.tol):
            ok = False
    out.append(f"tol={args.tol:g} status={'pass' if ok else 'FAIL'}")
    print("RESULT " + " ".join(out))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
