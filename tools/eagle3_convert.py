"""Convert an EAGLE-3 head between the original and the speculators layout.

    python tools/eagle3_convert.py SRC DST --to speculators [--verifier NAME]
    python tools/eagle3_convert.py SRC DST --to original
    python tools/eagle3_convert.py SRC --check TARGET_DIR     # load against a target, print a summary

SRC: a head directory (config.json + model.safetensors or pytorch_model.bin) in either layout;
DST gets config.json + model.safetensors. Errors are one line on stderr and exit status 2.
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("src")
    p.add_argument("dst", nargs="?")
    p.add_argument("--to", choices=["original", "speculators"])
    p.add_argument("--verifier", default=None, help="speculators_config.verifier.name_or_path")
    p.add_argument("--check", metavar="TARGET_DIR", default=None,
                   help="load SRC against the target checkpoint's config.json and print a summary")
    a = p.parse_args(argv)
    from graphrt.checkpoint.hf_files import CheckpointError
    from graphrt.speculative.eagle3 import convert_head
    try:
        if a.check is not None:
            return _check(Path(a.src), Path(a.check))
        if a.dst is None or a.to is None:
            print("eagle3_convert: give DST and --to (or --check TARGET_DIR)", file=sys.stderr)
            return 2
        out = convert_head(a.src, a.dst, a.to, verifier=a.verifier)
    except (CheckpointError, ValueError) as e:
        print(f"eagle3_convert: {e}", file=sys.stderr)
        return 2
    print(f"wrote {out} ({a.to} layout)")
    return 0


def _check(src: Path, target: Path) -> int:
    from graphrt.checkpoint.loader import read_config
    from graphrt.model.spec import LlamaSpec
    from graphrt.speculative.eagle3 import load_eagle3
    import transformers
    raw, _ = read_config(target)
    spec = LlamaSpec.from_hf(transformers.AutoConfig.for_model(**raw))
    ck = load_eagle3(src, spec)
    c = ck.config
    print(f"{src}: {c.layout} layout, hidden {c.hidden_size}, heads {c.num_heads}/{c.num_kv_heads}, "
          f"draft vocabulary {c.draft_vocab_size} of {c.vocab_size}, target layers {list(ck.layer_ids)}, "
          f"{ck.weights.nbytes / 1e6:.1f} MB")
    return 0


if __name__ == "__main__":
    sys.exit(main())
