#!/usr/bin/env bash
# Install a Gradescope package the way Gradescope does and grade submissions through it. Run by
# tests/deploy/test_gradescope_deploy.py inside `unshare -m` (a private mount namespace), as root:
# a tmpfs at the real /autograder, the zip unpacked into /autograder/source, its own setup.sh (a
# fresh venv, the pinned packages), then per submission its own run_autograder from the copy
# Gradescope makes at /autograder/run_autograder. Nothing outlives the namespace but OUT.
#   [RUN_PREFIX=...] deploy_gradescope.sh PACKAGE.zip SUBMISSIONS_DIR OUT_DIR
set -euo pipefail
package=$1 submissions=$2 out=$3
ms_since() { echo $(( ($(date +%s%N) - $1) / 1000000 )); }

mount --make-rprivate /
mount -t tmpfs -o mode=0755,size=8g tmpfs /autograder
mkdir /autograder/source
unzip -q "$package" -d /autograder/source

# RUN_PREFIX (the test's): the privileges run_autograder gets; a prefix that drops CAP_SYS_ADMIN must
# leave the grader no mount namespace, or the permissions-only path it stands for is not the one tested
if [ -n "${RUN_PREFIX:-}" ] && $RUN_PREFIX unshare -m true 2>/dev/null; then
    echo "RUN_PREFIX='$RUN_PREFIX' still allows a mount namespace" >&2; exit 1
fi

start=$(date +%s%N)
bash /autograder/source/setup.sh >"$out/setup.log" 2>&1
echo "{\"setup_ms\": $(ms_since "$start"), \"venv_mib\": $(du -sm /autograder/venv | cut -f1)}" >"$out/setup.json"

for folder in "$submissions"/*/; do
    name=$(basename "$folder")
    rm -rf /autograder/submission /autograder/results /autograder/run_autograder
    mkdir /autograder/submission
    cp -r "$folder". /autograder/submission/
    cp /autograder/source/run_autograder /autograder/run_autograder
    start=$(date +%s%N)
    ${RUN_PREFIX:-} bash /autograder/run_autograder >"$out/$name.log" 2>&1
    ms_since "$start" >"$out/$name.ms"
    cp /autograder/results/results.json "$out/$name.json"
done
