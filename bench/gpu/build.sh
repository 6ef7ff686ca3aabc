#!/usr/bin/env bash
# Builds the GPU binaries offline and packs the device bundle into OUT_DIR (≤ 60 MiB), the
# shape of k8s/Dockerfile.cuda: `rhosynth-worker` with burn-cuda (`--check-gpu` is its check),
# the coordinator `rhosynth` on the CPU (it draws the noise), stripped and xz-compressed;
# CUDA's libdevice (the maths kernels' bitcode); check.sh; the examples; Adult for the
# end-to-end job when ../shared/data has it.
#   bench/gpu/build.sh OUT_DIR
# CubeCL's build script would download LLVM: the registry's static LLVM wheels (with the
# NVPTX backend) stand in for it, in the folder and with the marker it looks for. No CUDA
# toolkit is needed: the driver is loaded at run time (no newer than CUDARC_CUDA_VERSION).
set -euo pipefail
# The bundle may hold Adult: private to whoever builds it.
umask 077
out=${1:?usage: bench/gpu/build.sh OUT_DIR}
repo=$(cd "$(dirname "$0")/../.." && pwd)
# OUT_DIR is emptied first: only a folder that is empty or an earlier bundle.
if [ -n "$(ls -A "$out" 2>/dev/null)" ] && [ ! -e "$out/.rhosynth-gpu-bundle" ]; then
  echo "$out is neither empty nor a GPU bundle: refusing to empty it" >&2
  exit 1
fi
mkdir -p "$out"
out=$(cd "$out" && pwd)
target=${CARGO_TARGET_DIR:-$repo/target/cuda}
tools=$target/gpu-tools
pip() { python3 -m pip install --quiet --disable-pip-version-check --no-deps "$@"; }

# The tools folder is ready once its own marker is there (written last).
if [ ! -e "$tools/.ready" ]; then
  rm -rf "$tools" && mkdir -p "$tools/xdg/tracel"
  pip --target "$tools/llvm" mlc-llvm-static==23.1.1.post0 mlc-llvm-static-extra-targets==23.1.1.post0
  pip --target "$tools/nvcc" nvidia-cuda-nvcc-cu12==12.9.86
  ln -s "$tools/llvm/mlc_llvm_static/static" "$tools/xdg/tracel/tracel-llvm-23.1.0-4"
  touch "$tools/xdg/tracel/tracel-llvm-23.1.0-4/.tracel-llvm-installed" "$tools/.ready"
fi

start=$(date +%s)
export XDG_DATA_HOME=$tools/xdg CUDARC_CUDA_VERSION=${CUDARC_CUDA_VERSION:-12080} CARGO_TARGET_DIR=$target
# As k8s/Dockerfile.cuda: the worker with CUDA, the coordinator without.
cargo build --release --locked -p rhosynth-worker --features cuda --bin rhosynth-worker
cargo build --release --locked --bin rhosynth
echo "built in $(( $(date +%s) - start )) s" >&2

rm -rf "${out:?}"/* && touch "$out/.rhosynth-gpu-bundle" && mkdir -p "$out/cuda/nvvm/libdevice"
for bin in rhosynth rhosynth-worker; do
  strip -o "$out/$bin" "$target/release/$bin"
  xz -T0 -6 "$out/$bin"
done
cp "$tools/nvcc/nvidia/cuda_nvcc/nvvm/libdevice/libdevice.10.bc" "$out/cuda/nvvm/libdevice/"
cp "$repo/bench/gpu/check.sh" "$repo/bench/cluster.sh" "$out/"
cp -r "$repo/examples" "$out/examples"
if [ -d "$repo/../shared/data/adult" ]; then
  mkdir -p "$out/data/adult" && cp "$repo/../shared/data/adult/adult."{data,test} "$out/data/adult/"
  xz -T0 "$out/data/adult/"*
fi
du -sh "$out" >&2
