# Session 38: the shipped 6-layer drafter cut to its first K layers (no retraining); fc, hidden_norm, norm kept.
# python make.py jaxspec/demo/drafter K /tmp/trunc/dK
import json, sys, glob, os
from safetensors import safe_open
from safetensors.flax import save_file
src, k, dst = sys.argv[1], int(sys.argv[2]), sys.argv[3]
os.makedirs(dst, exist_ok=True)
cfg = json.load(open(f"{src}/config.json"))
cfg["num_hidden_layers"] = k
cfg["layer_types"] = cfg["layer_types"][:k]
json.dump(cfg, open(f"{dst}/config.json", "w"), indent=2)
out = {}
for f in sorted(glob.glob(f"{src}/*.safetensors")):
    with safe_open(f, "flax") as s:
        for key in s.keys():
            if key.startswith("layers.") and int(key.split(".")[1]) >= k:
                continue
            out[key] = s.get_tensor(key)
save_file(out, f"{dst}/model.safetensors")
print(dst, len(out))
