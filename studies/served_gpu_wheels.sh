#!/usr/bin/env bash
# Build what a GPU machine without a package index needs to run vLLM 0.25.0 (issue 47), here,
# into folders that .git/info/exclude ignores, each under the device tool's per-call limit:
#   .gpu1/part0 .gpu2/part1 .gpu3/part2 .gpu4/part3  the stripped wheel (145 MB) in 40 MB parts
#   .gpu4/deps/*.whl                                  the 23 dependencies the image lacks (18.7 MB)
# On the machine: carry one folder per call (back to back: a machine idles back after 30 s),
# copy each part to /tmp/parts, then join and install (see docs/engines.md, "vLLM on a CUDA GPU"):
#   cat /tmp/parts/part{0,1,2,3} > /tmp/vllm.zip && python3 -m zipfile -e /tmp/vllm.zip /tmp/site
#   python3 -m pip install -q --no-index --no-deps --target /tmp/site .gpu4/deps/*.whl
#   PYTHONPATH=/tmp/site python studies/served_gpu.py --out DIR
set -euo pipefail
cd "$(dirname "$0")/.."
W=${WORK:-/tmp/served-wheels}
mkdir -p "$W" .gpu1 .gpu2 .gpu3 .gpu4/deps
for d in .gpu1 .gpu2 .gpu3 .gpu4; do grep -qx "/$d/" .git/info/exclude 2>/dev/null || echo "/$d/" >> .git/info/exclude; done
PLAT=(--only-binary=:all: --python-version 3.12 --implementation cp --platform manylinux_2_28_x86_64
      --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 --platform manylinux_2_24_x86_64
      --platform manylinux_2_27_x86_64 --platform manylinux_2_31_x86_64 --platform manylinux_2_34_x86_64)
python3 -m pip download --no-deps "${PLAT[@]}" -d "$W" vllm==0.25.0
cp "$W"/vllm-0.25.0-*.whl "$W/slim.zip"
# FA2 (FA3 serves Hopper), the Rust front end, Blackwell / FP8 kernel sources and other Pythons' builds
zip -q -d "$W/slim.zip" "vllm/vllm_flash_attn/_vllm_fa2_C.abi3.so" "vllm/vllm-rs" "vllm/third_party/fmha_sm100/*" \
    "vllm/third_party/deep_gemm/include/*" "vllm/third_party/deep_gemm/_C.cpython-31[0134]*"
split -b 40000000 -d -a 1 "$W/slim.zip" "$W/part"
for i in 0 1 2 3; do mv "$W/part$i" ".gpu$((i + 1))/"; done
python3 -m pip download --no-deps "${PLAT[@]}" -d .gpu4/deps annotated-types==0.8.0 apache-tvm-ffi==0.1.15.post2 \
    cachetools==8.0.3 cbor2==6.3.0 fastapi==0.136.3 httpx2==2.17.0 jmespath==1.1.0 llguidance==1.9.1 \
    model-hosting-container-standards==0.1.16 msgspec==0.23.0 openai==3.63.0 openai-harmony==0.0.8 \
    partial-json-parser==0.2.1.1.post7 pybase64==1.5.1 pydantic==2.14.4 pydantic-core==2.50.5 pyzmq==27.3.0 \
    sniffio==1.3.1 starlette==1.10.0 typing-inspection==0.4.5 uvicorn==0.55.0 watchfiles==1.3.0 xgrammar==0.2.9 \
    prometheus-fastapi-instrumentator==8.1.0
du -sb .gpu1 .gpu2 .gpu3 .gpu4
