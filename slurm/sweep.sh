#!/usr/bin/env bash
# Submits a grid of dayzero scaling runs: every (nodes, ranks per node, CP, TP, EP) whose rank count is
# divisible by CP x TP (and EP = 1 or TP times a divisor of CP). Each run writes RESULTS/<name>.h5 and the report RESULTS/<name>.json;
# summarize them with `python3 slurm/summarize.py RESULTS`.
#
#   slurm/sweep.sh --model DIR --input IN.h5 --results DIR [--nodes 1,2,4] [--ranks-per-node 1,4,8]
#                  [--cp 1,2] [--tp 1,2] [--ep 1,4] [--mode logprobs] [--backend cpu] [--extra "FLAGS"]
#                  [--dry-run] [--wait] [-- more sbatch options, e.g. --time=1:00:00 -p gpu]
#
# --dry-run prints the sbatch commands and submits nothing. --wait waits for every submitted job to
# leave the queue. Previous results of a grid point are removed before it is submitted (scaling runs
# start from scratch; the template itself always resumes). DZ_BIN is passed through when set.
set -euo pipefail
usage() { sed -n '2,13p' "$0" | sed 's/^# \{0,1\}//'; exit 2; }

HERE=$(cd "$(dirname "$0")" && pwd)
MODEL="" INPUT="" RESULTS="" NODES=1 RPN=1,2 CPS=1 TPS=1 EPS=1 MODE=logprobs BACKEND=cpu EXTRA="" DRY=0 WAIT=0
SBATCH_ARGS=()
while [ $# -gt 0 ]; do
  case $1 in
    --model) MODEL=$2; shift ;;
    --input) INPUT=$2; shift ;;
    --results) RESULTS=$2; shift ;;
    --nodes) NODES=$2; shift ;;
    --ranks-per-node) RPN=$2; shift ;;
    --cp) CPS=$2; shift ;;
    --tp) TPS=$2; shift ;;
    --ep) EPS=$2; shift ;;
    --mode) MODE=$2; shift ;;
    --backend) BACKEND=$2; shift ;;
    --extra) EXTRA=$2; shift ;;
    --dry-run) DRY=1 ;;
    --wait) WAIT=1 ;;
    --) shift; SBATCH_ARGS=("$@"); break ;;
    -h | --help) usage ;;
    *) echo "sweep.sh: unknown option $1" >&2; usage ;;
  esac
  shift
done
[ -n "$MODEL" ] && [ -n "$INPUT" ] && [ -n "$RESULTS" ] || { echo "sweep.sh: --model, --input and --results are required" >&2; usage; }
abspath() { case $1 in /*) echo "$1" ;; *) echo "$PWD/$1" ;; esac; }
MODEL=$(abspath "$MODEL") INPUT=$(abspath "$INPUT") RESULTS=$(abspath "$RESULTS")
[ "$DRY" = 1 ] || mkdir -p "$RESULTS"

jobs=()
n_points=0
IFS=, read -r -a node_list <<<"$NODES"
IFS=, read -r -a rpn_list <<<"$RPN"
IFS=, read -r -a cp_list <<<"$CPS"
IFS=, read -r -a tp_list <<<"$TPS"
IFS=, read -r -a ep_list <<<"$EPS"
for n in "${node_list[@]}"; do
  for r in "${rpn_list[@]}"; do
    for c in "${cp_list[@]}"; do
      for t in "${tp_list[@]}"; do
       for e in "${ep_list[@]}"; do
        ranks=$((n * r))
        if [ $((ranks % (c * t))) -ne 0 ]; then
          echo "# skip nodes=$n ranks/node=$r cp=$c tp=$t: $ranks ranks not divisible by cp*tp=$((c * t))"
          continue
        fi
        if [ "$e" != 1 ] && { [ $((e % t)) -ne 0 ] || [ $((c % (e / t > 0 ? e / t : 1))) -ne 0 ] || [ "$e" -lt "$t" ]; }; then
          echo "# skip cp=$c tp=$t ep=$e: ep must be tp times a divisor of cp"
          continue
        fi
        name=n${n}_r${r}_cp${c}_tp${t}
        [ "$e" != 1 ] && name=${name}_ep${e}
        template=$HERE/dayzero-multinode.sbatch
        [ "$n" = 1 ] && template=$HERE/dayzero-1node.sbatch
        cmd=(env DZ_MODEL="$MODEL" DZ_INPUT="$INPUT" DZ_OUTPUT="$RESULTS/$name.h5" DZ_REPORT="$RESULTS/$name.json"
             DZ_MODE="$MODE" DZ_BACKEND="$BACKEND" DZ_CP="$c" DZ_TP="$t" DZ_EP="$e" DZ_EXTRA="$EXTRA")
        [ -n "${DZ_BIN:-}" ] && cmd+=(DZ_BIN="$(abspath "$DZ_BIN")")
        cmd+=(sbatch --parsable --job-name="dz-sweep-$name" --nodes="$n" --ntasks-per-node="$r"
              --output="$RESULTS/%x-%j.out" "${SBATCH_ARGS[@]}" "$template")
        n_points=$((n_points + 1))
        if [ "$DRY" = 1 ]; then
          printf '%q ' "${cmd[@]}"; echo
        else
          rm -f "$RESULTS/$name.h5" "$RESULTS/$name.h5.part" "$RESULTS/$name.json"
          id=$("${cmd[@]}")
          id=${id%%;*}
          jobs+=("$id")
          echo "submitted $name: job $id"
        fi
       done
      done
    done
  done
done
echo "# $n_points runs$([ "$DRY" = 1 ] && echo " (dry run: nothing submitted)")"
if [ "$DRY" = 0 ] && [ "$WAIT" = 1 ] && [ ${#jobs[@]} -gt 0 ]; then
  ids=$(IFS=,; echo "${jobs[*]}")
  while [ -n "$(squeue -h -j "$ids" -o %i 2>/dev/null)" ]; do sleep 2; done
  echo "# all jobs left the queue"
fi
[ "$DRY" = 1 ] || echo "# then: python3 $HERE/summarize.py $RESULTS"
