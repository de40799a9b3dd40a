import json, sys, os, hashlib
from safetensors.torch import load_file, save_file
src, dst = sys.argv[1], sys.argv[2]
os.makedirs(dst, exist_ok=True)
keep_out = {"gptq_w4_g32_e1"}
cases = ["gptq_w4_g128_i384", "gptq_w4_g64_pad", "gptq_w4_g32_e1", "gptq_w4_g128_nozero_w13",
         "gptq_w4_g128_fp16", "gptq_w8_g128", "gptq_w8_g128_nozero", "gptq_w8_g64_fp16",
         "awq_w4_g128", "awq_w4_g64_pad", "awq_w4_g32_nozero",
         "ct_w4_g128_sym", "ct_w4_g32_asym_pad", "ct_w4_g32_h320", "ct_w8_g128_sym", "ct_w8_g64_asym"]
total = 0
index = []
for c in cases:
    m = json.load(open(f"{src}/{c}.json"))
    assert m["versions"]["ops"] == "cuda" and not m.get("error")
    st = load_file(f"{src}/{c}.safetensors")
    out = {}
    for k, v in st.items():
        if k.startswith("in."):
            name = k[3:]
            if m["case"]["fmt"] == "gptq" and name.endswith("_qzeros"):
                continue  # registered by vLLM's GPTQ method, unused (symmetric)
            out[k] = v.contiguous()
        elif k.startswith("out.") and c in keep_out:
            out[k] = v.contiguous()
    save_file(out, f"{dst}/{c}.safetensors")
    j = {"case": m["case"], "versions": m["versions"], "glue": m["glue"],
         "pad_n_to_multiple": m["pad_n_to_multiple"], "pad_k_to_multiple": m["pad_k_to_multiple"],
         "inputs": {k: v for k, v in m["inputs"].items() if "in." + k in out},
         "outputs": m["outputs"],
         "outputs_stored": sorted(k[4:] for k in out if k.startswith("out.")),
         "sublayers": {s: {"layer_config_str": d["layer_config_str"],
                           "weight_schema": d["weight_schema"],
                           "input_schema": d["input_schema"]}
                       for s, d in m["sublayers"].items()}}
    with open(f"{dst}/{c}.json", "w") as f:
        json.dump(j, f, indent=1)
        f.write("\n")
    sz = os.path.getsize(f"{dst}/{c}.safetensors") + os.path.getsize(f"{dst}/{c}.json")
    total += sz
    print(c, sz)
print("total", total)
