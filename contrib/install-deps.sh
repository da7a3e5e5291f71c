#!/usr/bin/env bash
# Installs every Debian package Hearth needs to build and test; safe to run again.
# The CUDA toolkit (nvcc, cuBLASLt, NCCL) is not a Debian package here: when nvcc is on
# PATH the CUDA sources are compiled too, otherwise they are skipped.
set -euo pipefail

packages=(
    build-essential   # gcc, make
    pkg-config
    libyaml-dev       # presets, run configs, experiment specs
    libjansson-dev    # canonical config JSON, metrics.jsonl, result.json
    libssl-dev        # sha256 of the canonical config (libcrypto)
    libpng-dev        # image decoding (hearth-prep)
    libjpeg62-turbo-dev  # image decoding (hearth-prep)
    libcmocka-dev     # unit tests
    chromium          # tests: hearth report's SVG rendered headless to a PNG
    librsvg2-bin      # tests: rsvg-convert renders hearth report's SVG; pixels checked
    libxml2-utils     # tests: xmllint checks hearth report's SVG is well-formed
    groff             # tests: the generated manual pages render without warnings
    man-db            # man -l for those pages
    libsqlite3-dev    # results database (orchestrator)
    sqlite3
    libcurl4-openssl-dev  # slurmrestd backend (orchestrator)
    libpmix-dev       # rank bootstrap of hearth-train under srun --mpi=pmix (trainer)
    openmpi-bin       # mpirun: a PMIx server without Slurm, for the bootstrap tests
    slurm-wlm         # slurmctld + slurmd for the throw-away test cluster (contrib/slurm-local)
    slurm-client      # sbatch, squeue, sacct, scontrol, scancel (slurm backend)
    munge             # Slurm's authentication
    slurmrestd        # Slurm's REST API (slurmrest backend; start.sh --rest)
    slurm-wlm-jwt-plugin  # auth/jwt: slurmrestd's clients authenticate with `scontrol token`
    slurmdbd          # Slurm's accounting daemon: sacct works (start.sh --with-dbd)
    mariadb-server    # slurmdbd's database (a throw-away datadir under the cluster's directory)
    clang-14          # fuzz targets (make fuzz, make fuzz-smoke: libFuzzer, ASan, UBSan)
    libclang-rt-14-dev  # libFuzzer and the sanitizer runtimes for clang-14
)

missing=()
for p in "${packages[@]}"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ "${#missing[@]}" -eq 0 ]; then
    echo "install-deps: all ${#packages[@]} packages present"
    exit 0
fi
echo "install-deps: installing ${missing[*]}"
SUDO=""
[ "$(id -u)" -eq 0 ] || SUDO=sudo
export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get update
$SUDO apt-get install -y --no-install-recommends "${missing[@]}"
