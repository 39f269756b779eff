#!/usr/bin/env bash
# Coverage-guided fuzzing (libFuzzer via cargo-fuzz) of every decoder that reads outside bytes.
#
#   scripts/fuzz.sh [CPU_SECONDS_PER_TARGET] [TARGET...] # default: 60, every target in fuzz/
#   SPTR_FUZZ_RUNS=5000 scripts/fuzz.sh                    # a fixed number of inputs per target
#                                                          # from the seeds alone, fixed random seed
#
# Each target, fuzz/fuzz_targets/<target>.rs, runs the check in fuzz/checks/<target>.rs. CI does
# not run this script: `cargo test` replays the same checks (tests/fuzz_replay.rs) on the seeds
# that seed() below builds (the test builds them the same way: change both together), on the
# findings in tests/data/fuzz/<target>/ and on a fixed set of deterministic mutations of each,
# without the nightly toolchain or cargo-fuzz. This script is for the coverage-guided runs, which
# find new inputs.
#
# A long run's budget is CPU time, not wall time: on a busy machine libFuzzer's wall-clock limit
# would give a target less than asked, so a target runs in rounds (each continuing from the
# grown corpus) until its processes have used CPU_SECONDS of CPU (user + system). A round lasts
# at most 10 minutes (SPTR_FUZZ_ROUND_S) and the CPU time of the finished rounds is kept in
# fuzz/artifacts/<target>.progress: a long run cut off (the machine stopped or gone) goes on
# from there when started again with the same budget, and only the round under way is lost; the
# progress file goes when the target's summary is written.
#
# Installs what it needs when missing (the nightly toolchain, cargo-fuzz), seeds each target's
# corpus from the committed test data (tests/data, config), keeps the grown corpus in
# ~/.cache/sptr/fuzz/corpus/<target> between runs, and writes reproducers of any crash, timeout
# (> 1 s an input) or out-of-memory case (> 2 GB resident, or one allocation > 2 GB) to
# fuzz/artifacts/<target>/. One JSON line per target goes to fuzz/artifacts/summary.jsonl (runs,
# executions per second, CPU seconds, coverage, corpus size, outcome); the file is appended to,
# so runs on several occasions add up. Exit status 1 if any target failed.
# A found input is fixed in the code and kept as a regression test under tests/data/fuzz/ (run
# by tests/fuzz_regressions.rs, and replayed with its mutations by tests/fuzz_replay.rs, in the
# normal suite).
set -uo pipefail
cd "$(dirname "$0")/.."
SECS=${1:-60}
shift || true
CACHE=${SPTR_FUZZ_CACHE:-$HOME/.cache/sptr/fuzz}
ART=fuzz/artifacts
ROUND_S=${SPTR_FUZZ_ROUND_S:-600}  # the longest a round of a long run lasts (wall seconds)
export CARGO_TARGET_DIR=${SPTR_FUZZ_TARGET_DIR:-$CACHE/target}

if ! rustup run nightly rustc --version > /dev/null 2>&1; then
    echo "fuzz: installing the nightly toolchain (libFuzzer's sanitizer flags need it)"
    rustup toolchain install nightly --profile minimal || exit 1
fi
if ! cargo fuzz --version > /dev/null 2>&1; then
    echo "fuzz: installing cargo-fuzz"
    cargo install cargo-fuzz --locked || exit 1
fi

targets=("$@")
if [ ${#targets[@]} -eq 0 ]; then
    mapfile -t targets < <(cd fuzz && cargo +nightly fuzz list)
fi

# Seeds: small committed files from tests/data and config, per target.
seed() {
    local t=$1 dir=$2
    mkdir -p "$dir"
    case $t in
        cloud_cdr) cp tests/data/cdr/pointcloud2.*.cdr "$dir" ;;
        image_cdr) cp tests/data/cdr/image.*.cdr "$dir" ;;
        compressed_image_cdr) cp tests/data/cdr/compressed_image.*.cdr "$dir" ;;
        camera_info_cdr) cp tests/data/cdr/camera_info.*.cdr "$dir" ;;
        jpeg) cp tests/data/camera/*.jpg "$dir" ;;
        png) cp tests/data/camera/*.png "$dir" ;;
        pcd) printf 'VERSION .7\nFIELDS x y z intensity\nSIZE 4 4 4 4\nTYPE F F F F\nCOUNT 1 1 1 1\nWIDTH 2\nHEIGHT 1\nPOINTS 2\nDATA ascii\n1 2 3 4\n5 6 7 8\n' > "$dir/ascii.pcd"
             { printf 'VERSION .7\nFIELDS x y z\nSIZE 4 4 4\nTYPE F F F\nCOUNT 1 1 1\nWIDTH 2\nHEIGHT 1\nPOINTS 2\nDATA binary\n'; head -c 24 tests/data/semantickitti/000000.bin; } > "$dir/binary.pcd" ;;
        bin_cloud) { printf '\x04'; head -c 1600 tests/data/semantickitti/000000.bin; } > "$dir/kitti"
                   { printf '\x05'; head -c 2000 tests/data/nuscenes/*.pcd.bin; } > "$dir/nuscenes" ;;
        mcap_file) cp tests/data/bags/mcap_small/*.mcap tests/data/bags/mcap_zstd/*.mcap "$dir" ;;
        sqlite_bag) cp tests/data/bags/sqlite_small/*.db3 "$dir" ;;
        bag_metadata) for b in mcap_small sqlite_small; do cp tests/data/bags/$b/metadata.yaml "$dir/$b.yaml"; done ;;
        safetensors) python3 - "$dir/tiny.safetensors" <<'PY'
import json, struct, sys
header = json.dumps({"a.weight": {"dtype": "F32", "shape": [2, 2], "data_offsets": [0, 16]},
                     "b": {"dtype": "F16", "shape": [2], "data_offsets": [16, 20]}}).encode()
open(sys.argv[1], "wb").write(struct.pack("<Q", len(header)) + header + bytes(20))
PY
        ;;
        model_yaml) cp config/models/*.yaml "$dir" ;;
        params_yaml) cp config/*.yaml "$dir" ;;
        calib_json) cp tests/data/nuscenes/calib.json "$dir" ;;
        *) [ -d "tests/data/fuzz/$t" ] || echo "fuzz: no seeds for $t" ;;
    esac
    # Earlier findings are seeds too.
    [ -d "tests/data/fuzz/$t" ] && cp tests/data/fuzz/"$t"/* "$dir" 2>/dev/null
    return 0
}

dict_for() {
    case $1 in
        cloud_cdr|image_cdr|compressed_image_cdr|camera_info_cdr|jpeg|png) echo fuzz/dict/cdr.dict ;;
        mcap_file) echo fuzz/dict/mcap.dict ;;
        bag_metadata|model_yaml|params_yaml) echo fuzz/dict/yaml.dict ;;
        safetensors) echo fuzz/dict/safetensors.dict ;;
        calib_json) echo fuzz/dict/json.dict ;;
    esac
}

# Whether every new timeout or slow-unit reproducer of target $1 runs within the limit three
# times out of three when executed again on its own: then they were the host's delays, not the
# input's. libFuzzer writes a slow unit for an input that took over 10 s without its 1 s timeout
# firing, which happens when the process was stopped mid-input (a 5 ms sqlite input was written
# as a 39 s slow unit when the machine was paused). A re-run is judged by its
# CPU time (user + system, under 1 s), not its wall time, which a busy machine stretches too (a
# JPEG that decodes in 0.2 s took 1.3 s beside a CI run), with a 30 s wall limit for a real hang.
# They move to $ART/$1/not-reproduced/ (kept for a look) and the log says so; crash, OOM or leak
# reproducers, or a timeout or slow unit that reproduces, are findings.
delays_not_reproduced() {
    local t=$1 log=$2 f ok=1 n=0 cpu_ms
    ls "$ART/$t" | grep -qE '^(crash|oom|leak)-' && return 1
    for f in "$ART/$t"/timeout-* "$ART/$t"/slow-unit-*; do
        [ -f "$f" ] || continue
        n=$((n + 1))
        for _ in 1 2 3; do
            if ! ("$CARGO_TARGET_DIR/x86_64-unknown-linux-gnu/release/$t" -timeout=30 -rss_limit_mb=2048 "$f" >> "$log" 2>&1
                  rc=$?; times > "$ART/$t.rerun.cpu"; exit $rc); then
                ok=0
            fi
            cpu_ms=$(cpu_ms_of "$ART/$t.rerun.cpu")
            echo "fuzz: $t: re-run of $(basename "$f"): $cpu_ms ms of CPU" >> "$log"
            [ "$cpu_ms" -lt 1000 ] || ok=0
        done
    done
    [ "$n" -gt 0 ] && [ "$ok" = 1 ] || return 1
    mkdir -p "$ART/$t/not-reproduced"
    find "$ART/$t" -maxdepth 1 -type f \( -name 'timeout-*' -o -name 'slow-unit-*' \) -exec mv {} "$ART/$t/not-reproduced/" \;
    echo "fuzz: $t: $n timeout(s) or slow unit(s) not reproduced on re-runs (each under 1 s of CPU: host load or a paused machine), moved to $ART/$t/not-reproduced/; fuzzing goes on" | tee -a "$log"
    return 0
}

# CPU milliseconds (children's user + system) in the output of `times` saved in file $1.
cpu_ms_of() {
    python3 -c '
import re, sys
line = open(sys.argv[1]).read().splitlines()[-1]
print(sum(round((int(m) * 60 + float(s)) * 1000) for m, s in re.findall(r"(\d+)m([\d.]+)s", line)))' "$1"
}

mkdir -p "$ART"
summary="$ART/summary.jsonl"
echo "fuzz: building ${#targets[@]} targets"
(cd fuzz && cargo +nightly fuzz build 2>&1 | tail -3) || true
failed=0
for t in "${targets[@]}"; do
    corpus="$CACHE/corpus/$t"
    # A fixed run count starts from the committed seeds with a fixed random seed, so that a CI
    # pass explores the same inputs every time (no luck involved); the cached corpus is for the
    # long runs.
    budget=(-max_total_time="$SECS")
    if [ -n "${SPTR_FUZZ_RUNS:-}" ]; then
        corpus="$CACHE/ci-corpus/$t"
        rm -rf "$corpus"
        budget=(-runs="$SPTR_FUZZ_RUNS" -seed=1)
    fi
    seeds="$CACHE/seeds/$t"
    rm -rf "$seeds"
    seed "$t" "$seeds"
    mkdir -p "$corpus" "$ART/$t"
    dict=$(dict_for "$t")
    log="$ART/$t.log"
    progress="$ART/$t.progress"
    start=$(date +%s)
    wall_before=0  # wall seconds of the finished rounds of a run that was cut off
    cpu_ms=0
    round=0
    # A long run of the same budget that was cut off goes on: its log is appended to (the summary
    # counts the executions of every finished round in it) and its CPU time counts.
    if [ -z "${SPTR_FUZZ_RUNS:-}" ] && [ -f "$progress" ] && [ "$(cut -d' ' -f1 "$progress")" = "$SECS" ]; then
        read -r _ cpu_ms round wall_before < "$progress"
        echo "fuzz: $t: going on from round $round, $((cpu_ms / 1000)) CPU-s of $SECS done" | tee -a "$log"
    else
        : > "$log"
        rm -f "$progress"
    fi
    while :; do
        if [ -z "${SPTR_FUZZ_RUNS:-}" ]; then
            left=$(( SECS - cpu_ms / 1000 ))
            [ "$left" -le 0 ] && break
            budget=(-max_total_time="$(( left < ROUND_S ? left : ROUND_S ))")
        fi
        round=$((round + 1))
        # `times` in the round's subshell reports the CPU time of its children (cargo and the
        # fuzzer): user and system, the last line of its output.
        (cd fuzz && cargo +nightly fuzz run "$t" "$corpus" "$seeds" -- \
            "${budget[@]}" -timeout=1 -rss_limit_mb=2048 -malloc_limit_mb=2048 \
            -max_len=262144 -print_final_stats=1 -artifact_prefix="$PWD/../$ART/$t/" \
            ${dict:+-dict=$PWD/../$dict} >> "../$log" 2>&1
         rc=$?; times > "../$ART/$t.cpu"; exit $rc)
        rc=$?
        cpu_ms=$(( cpu_ms + $(cpu_ms_of "$ART/$t.cpu") ))
        echo "round $round: exit $rc, cpu so far $((cpu_ms / 1000)) s" >> "$log"
        [ -z "${SPTR_FUZZ_RUNS:-}" ] && echo "$SECS $cpu_ms $round $((wall_before + $(date +%s) - start))" > "$progress"
        # libFuzzer's timeout is wall time: on a loaded machine a fast input can pass 1 s while
        # the fuzzer waits for a core. A round that ended on timeouts only, or that wrote a slow
        # unit, is checked again; a slow unit that is slow on its own too is a finding.
        if ls "$ART/$t" | grep -qE '^(timeout|slow-unit)-'; then
            if delays_not_reproduced "$t" "$log"; then
                rc=0
                [ -n "${SPTR_FUZZ_RUNS:-}" ] && break
                continue
            fi
            [ "$rc" = 0 ] && rc=1
        fi
        # A fixed run count is one round; a finding ends the target's run.
        { [ -n "${SPTR_FUZZ_RUNS:-}" ] || [ "$rc" != 0 ]; } && break
    done
    secs=$(( wall_before + $(date +%s) - start ))
    python3 - "$t" "$rc" "$secs" "$log" "$corpus" "$ART/$t" "$cpu_ms" "$round" >> "$summary" <<'PY'
import json, os, re, sys, time
t, rc, secs, log, corpus, art, cpu_ms, rounds = sys.argv[1:]
text = open(log, errors="replace").read()
def stats(name):
    return [int(v) for v in re.findall(r"stat::%s:\s+(\d+)" % name, text)]
runs, rss = stats("number_of_executed_units"), stats("peak_rss_mb")
cov = re.findall(r"cov: (\d+) ft: (\d+)", text)
cpu = int(cpu_ms) / 1000
found = sorted(f for f in os.listdir(art) if f.split("-")[0] in ("crash", "timeout", "oom", "leak", "slow"))
spurious = len(os.listdir(os.path.join(art, "not-reproduced"))) if os.path.isdir(os.path.join(art, "not-reproduced")) else 0
outcome = "ok" if rc == "0" and not found else ("found: " + ", ".join(found) if found else f"exit {rc}")
print(json.dumps({"target": t, "date": time.strftime("%Y-%m-%d %H:%M"), "seconds": int(secs),
                  "cpu_seconds": round(cpu), "rounds": int(rounds), "runs": sum(runs) if runs else None,
                  "execs_per_cpu_s": round(sum(runs) / cpu) if runs and cpu else None,
                  "cov": int(cov[-1][0]) if cov else None, "features": int(cov[-1][1]) if cov else None,
                  "corpus": len(os.listdir(corpus)), "peak_rss_mb": max(rss) if rss else None,
                  "timeouts_not_reproduced": spurious,
                  "outcome": outcome}))
PY
    rm -f "$progress"
    tail -1 "$summary"
    if [ "$rc" != 0 ] || ls "$ART/$t" | grep -qE '^(crash|timeout|oom|leak|slow-unit)-'; then
        failed=1
        echo "fuzz: $t FAILED (log $log; reproducers in $ART/$t/)"
    fi
done
exit $failed
