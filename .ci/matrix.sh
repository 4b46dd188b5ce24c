#!/usr/bin/env bash
# The test matrix behind `make test`: the suite under the thread counts and BLAS kernels that
# change the last digits of results (DESIGN.md, portability), so a tolerance that only holds on
# one of them fails here rather than on another machine of the same kind.
#
#   leg             settings (on top of the caller's environment)      tests
#   full            every *_NUM_THREADS unset (each library on all      whole suite + e2e run
#                   cores, as `pytest` run outside make gets; the CLI
#                   of the e2e run sets one BLAS thread itself);
#                   OPENBLAS_CORETYPE as the caller has it
#   omp1            OMP_NUM_THREADS=1 and make's OPENBLAS_NUM_THREADS=1 fast tier
#                   (torch and OpenBLAS on one thread)
#   coretype-auto   OPENBLAS_CORETYPE unset (OpenBLAS picks its kernel  fast tier + e2e run
#                   for this CPU: SkylakeX on AVX-512); skipped when the
#                   caller has it unset, as the full leg then is this one
#   haswell         OPENBLAS_CORETYPE=Haswell and                       fast tier + e2e run
#                   MKL_ENABLE_INSTRUCTIONS=AVX2: the AVX2 paths both
#                   libraries take on AMD EPYC Zen 2/3 and other
#                   AVX2-only CPUs (OpenBLAS's Haswell kernel; torch's
#                   MKL on AVX2, where float32 forwards depend on batch
#                   size and thread count)
#
# Fast tier: `pytest -m "not real and not full_leg"` (everything except the tests marked `real`, which
# load the embedded SmolLM2, and those marked `full_leg`: training and censuses of tiny models, which
# change no LAPACK kernel's result the other tests do not cover). The e2e run is a small
# `depthlens run` of every stage on SmolLM2, with every Schur order, on the legs that change the
# LAPACK kernels (where a decomposition can fail to converge); the legs that change only thread
# counts or torch's float32 forwards get the fast tier, whose tests set both thread counts
# themselves where results depend on them (tests/test_determinism.py), which keeps the matrix
# short (its measured time: README.md, Set-up). Before each leg the kernels
# threadpoolctl and torch report under its settings are printed, and a setting
# that did not take effect (another OpenBLAS kernel, another torch thread count) fails the leg.
#
# Every leg runs even when an earlier one failed (one CI run shows every failing setting); the
# script exits 1 if any leg failed, and a pytest run that collects no test (exit 5) fails too.
# MATRIX_LEGS="full haswell" runs only those legs (e.g. `make test MATRIX_LEGS=full`).
set -uo pipefail
cd "$(dirname "$0")/.."
VENV=${VENV:-.venv}
PY="$VENV/bin/python"
DEPTHLENS="$VENV/bin/depthlens"
ALL_LEGS="full omp1 coretype-auto haswell"
LEGS=${MATRIX_LEGS:-$ALL_LEGS}
# SmolLM2 end to end, every stage and the report, a few minutes on 2 cores: small sizes, one
# Jacobian mode, exact funnel curves only (a rank above d = 576), no step-0 null checkpoint
# (each checkpoint's funnel needs 60 Schur forms of 576 x 576, the largest cost here).
E2E=(run --model smollm2-135m --chunks 4 --seq-len 64 --null-samples 2 --null-chunks 1 --certify none
     --probe-seqs 8 --probe-len 16 --jacobian-mode isolated --funnel-rank 1024 --null none --n-perm 100
     --heldout-chunks 1 --ablation-boot 200 --clamp-chunks 2 --control-seeds 1 --clamp-null-samples 1
     --contest-chunks 2 --contest-boot 200 --contest-perm 200 --overwrite --quiet)

# Prints the numerical environment of a process started with the leg's settings, and exits 3
# if what the leg sets (argv[1]: OPENBLAS_CORETYPE=<kernel> or torch_threads=<n>) is not in effect.
read -r -d '' KERNELS <<'EOF'
import os, sys
expect = dict(kv.split("=", 1) for kv in sys.argv[1].split()) if len(sys.argv) > 1 else {}
import numpy, scipy.linalg, torch, threadpoolctl  # load every BLAS before asking
env = {k: os.environ.get(k) for k in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS",
                                      "OPENBLAS_CORETYPE", "MKL_ENABLE_INSTRUCTIONS")}
print("  env:", " ".join(f"{k}={'(unset)' if v is None else v}" for k, v in env.items()))
bad = []
for lib in threadpoolctl.threadpool_info():
    arch = lib.get("architecture") or "-"
    print(f"  {lib['user_api']}: {lib['internal_api']} {lib.get('version') or ''} architecture={arch} "
          f"threading={lib.get('threading_layer') or '-'} num_threads={lib['num_threads']}  ({os.path.basename(lib['filepath'])})")
    want = expect.get("OPENBLAS_CORETYPE")
    if lib["internal_api"] == "openblas" and want and arch.lower() != want.lower():
        bad.append(f"OpenBLAS runs {arch}, not OPENBLAS_CORETYPE={want}")
print(f"  torch {torch.__version__}: num_threads={torch.get_num_threads()} "
      f"interop={torch.get_num_interop_threads()} cpu_capability={torch.backends.cpu.get_cpu_capability()} "
      f"mkl={torch.backends.mkl.is_available()}")
if "torch_threads" in expect and torch.get_num_threads() != int(expect["torch_threads"]):
    bad.append(f"torch runs {torch.get_num_threads()} threads, not {expect['torch_threads']}")
for line in bad:
    print("  setting not in effect:", line)
sys.exit(3 if bad else 0)
EOF

settings_of() {  # the `env` arguments of a leg
    case $1 in
        full) echo "-u OMP_NUM_THREADS -u OPENBLAS_NUM_THREADS -u MKL_NUM_THREADS" ;;
        omp1) echo "OMP_NUM_THREADS=1" ;;
        coretype-auto) echo "-u OPENBLAS_CORETYPE" ;;
        haswell) echo "OPENBLAS_CORETYPE=Haswell MKL_ENABLE_INSTRUCTIONS=AVX2" ;;
        *) return 1 ;;
    esac
}

expect_of() {  # what the kernel report must show under a leg's settings
    case $1 in
        omp1) echo "torch_threads=1" ;;
        haswell) echo "OPENBLAS_CORETYPE=Haswell" ;;
    esac
}

SUMMARY=()
FAILED=0
START=$SECONDS
for leg in $LEGS; do
    if ! settings=$(settings_of "$leg"); then
        echo "matrix: unknown leg '$leg' (known: $ALL_LEGS)" >&2
        exit 2
    fi
    if [[ $leg == coretype-auto && -z ${OPENBLAS_CORETYPE:-} && $LEGS == *full* ]]; then
        echo "=== leg coretype-auto: skipped, OPENBLAS_CORETYPE is unset here, so the full leg ran with OpenBLAS's own kernel"
        SUMMARY+=("$(printf '%-16s %-10s %-10s %5s' "$leg" skipped "(= full)" 0)")
        continue
    fi
    tier=(-m "not real and not full_leg")
    tier_name=fast
    if [[ $leg == full ]]; then
        tier=()
        tier_name=full
    fi
    # shellcheck disable=SC2086  # $settings is a list of env arguments
    run_env=(env $settings)
    t0=$SECONDS
    echo
    described=${settings:-no change}
    e2e=("${E2E[@]}")
    case $leg in
        omp1) e2e=() ;;
    esac
    echo "=== leg $leg: $described; $tier_name tier$([[ ${#e2e[@]} == 0 ]] || echo " + e2e run")"
    "${run_env[@]}" "$PY" -c "$KERNELS" "$(expect_of "$leg")"
    kernels_rc=$?
    "${run_env[@]}" "$PY" -m pytest -q -p no:cacheprovider "${tier[@]}"
    pytest_rc=$?
    if [[ $pytest_rc == 5 ]]; then
        echo "matrix: leg $leg collected no tests (pytest exit 5); the tier selection is wrong" >&2
    fi
    t1=$SECONDS
    e2e_rc=0
    if [[ ${#e2e[@]} != 0 ]]; then
        out=$(mktemp -d "${TMPDIR:-/tmp}/depthlens-matrix-$leg.XXXXXX")
        "${run_env[@]}" "$DEPTHLENS" "${e2e[@]}" --out "$out/run"
        e2e_rc=$?
        n_tables=$(find "$out/run/tables" -name '*.parquet' 2>/dev/null | wc -l)
        if [[ $e2e_rc == 0 && $n_tables -lt 10 ]]; then
            echo "matrix: leg $leg: the e2e run wrote only $n_tables tables" >&2
            e2e_rc=1
        fi
        rm -rf "$out"
    fi
    t2=$SECONDS
    status=ok
    if [[ $kernels_rc != 0 || $pytest_rc != 0 || $e2e_rc != 0 ]]; then
        status=FAILED
        FAILED=1
    fi
    echo "=== leg $leg: $status (settings check rc $kernels_rc, pytest rc $pytest_rc in $((t1 - t0)) s, e2e rc $e2e_rc in $((t2 - t1)) s)"
    SUMMARY+=("$(printf '%-16s %-10s %-10s %5s' "$leg" "$status" "$tier_name" $((t2 - t0)))")
done

echo
echo "=== matrix summary ($((SECONDS - START)) s)"
printf '%-16s %-10s %-10s %5s\n' leg result tier seconds
printf '%s\n' "${SUMMARY[@]}"
exit $FAILED
